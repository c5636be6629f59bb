"""The typed layer and activation records: what convert builds, their versioned dict form in saved
files, and files saved before the records existed (tests/data/*_v1.qb, written by qbackend at
78fc84d from tests/legacy_models.py) loading into the same records, routes and outputs as a fresh
conversion of the same model today."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import qbackend
from qbackend.core.records import RECORD_VERSION, ActivationRecord, EmbeddingInfo, LayerRecord
from qbackend.cli import main as cli_main
from qbackend.core.routes import FORCED, RULE, BatchRoutes, Route

from . import legacy_models

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_records_round_trip_through_dicts():
    route = Route("native", RULE, "rule [any shape]: why", rule="any shape",
                  batch_routes=BatchRoutes("n", ((4, "native"), (None, "onednn"))))
    rec = LayerRecord(kind="conv2d", mode="static", module="layer1.conv", post_op="relu", residual=True,
                      output="int8", shape={"n": 1, "kernel": (3, 3), "stride": (1, 1)}, x_shape=[1, 8, 4, 4],
                      route_by_batch=True, route=route, weight_rounding={"method": "gptq", "gain_db": 1.5})
    d = rec.to_dict()
    assert d["version"] == RECORD_VERSION and d["shape"]["kernel"] == [3, 3]
    assert LayerRecord.from_dict(d) == rec
    assert rec.why == "rule [any shape]: why; by batch size: n <= 4: native; n >= 5: onednn"
    assert rec.rule == "any shape"
    table = LayerRecord(kind="embedding_bag", mode="weight_only", module="t", route=Route("fbgemm", FORCED, "forced"),
                        embedding=EmbeddingInfo(8, "float16", "sum"), forced="fbgemm")
    assert LayerRecord.from_dict(table.to_dict()) == table and table.rule is None
    act = ActivationRecord(range=[-1.0, 2.0], dtype="uint8", symmetric=False, qmin=0, qmax=255, eps=1e-8,
                           smoothquant={"alpha": 0.5})
    assert ActivationRecord.from_dict(act.to_dict()) == act


def test_first_format_dicts_are_read():
    old = {"kind": "linear", "mode": "static", "module": "fc", "why": "rule [m <= 4]: FBGEMM ...", "post_op": "none",
           "residual": False, "output": "float32", "shape": {"m": 1, "k": 8, "n": 4}, "x_shape": [1, 8],
           "forced": None, "route_by_batch": True}
    rec = LayerRecord.from_dict(old)
    assert rec.route is None and rec.why == old["why"] and rec.shape == old["shape"] and rec.route_by_batch
    act = ActivationRecord.from_dict({"range": [0.0, 1.0], "dtype": "uint8", "symmetric": False, "qmin": 0,
                                      "qmax": 255, "eps": 1e-8})
    assert act.qmax == 255 and act.smoothquant is None
    with pytest.raises(ValueError, match="a layer record has version 99; this qbackend reads version"):
        LayerRecord.from_dict({**rec.to_dict(), "version": 99})
    for bad, shown in (("2", r"'2' \(str\)"), (True, r"True \(bool\)")):
        with pytest.raises(ValueError, match=rf"a layer record is malformed: its 'version' field must be an int, "
                                             rf"got {shown}"):
            LayerRecord.from_dict({**rec.to_dict(), "version": bad})
        with pytest.raises(ValueError, match=rf"an activation record is malformed: .*got {shown}"):
            ActivationRecord.from_dict({**act.to_dict(), "version": bad})


def test_convert_builds_typed_records():
    qmodel, _ = legacy_models.build("static")
    assert all(isinstance(r, LayerRecord) for r in qmodel.qbackend_layers.values())
    assert all(isinstance(r, ActivationRecord) for r in qmodel.qbackend_activations.values())
    for name, rec in qmodel.qbackend_layers.items():
        assert rec.route is not None and rec.route.provider == qmodel.layer(name).provider, name
    assert qmodel.qbackend_layers["table"].embedding == EmbeddingInfo(8, "float16", "sum")
    rows = {r["layer"]: r for r in qbackend.explain(qmodel)}
    assert all(rows[n]["rule"] == rec.route.rule for n, rec in qmodel.qbackend_layers.items())


@pytest.mark.parametrize("how", ["allow_pickle", "upgraded"])
@pytest.mark.parametrize("kind", sorted(legacy_models.FIXTURES))
def test_files_saved_before_the_records_still_load(kind, how, tmp_path):
    """Format-1 files (pickled, written before the records existed) load with allow_pickle=True, and
    after `qbackend upgrade` without it, as the same model."""
    path = os.path.join(DATA, legacy_models.FIXTURES[kind])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "allow_pickle":
            with pytest.warns(qbackend.serialization.PickleFileWarning, match="can run code"):
                loaded = qbackend.load(path, allow_pickle=True)
        else:
            assert cli_main(["upgrade", path, str(tmp_path / "new.qb")]) == 0
            loaded = qbackend.load(tmp_path / "new.qb", classes=[legacy_models])
        fresh, batch = legacy_models.build(kind)
    assert list(loaded.qbackend_layers) == list(fresh.qbackend_layers)
    assert [r["provider"] for r in qbackend.explain(loaded)] == [r["provider"] for r in qbackend.explain(fresh)]
    for name, rec in loaded.qbackend_layers.items():
        new = fresh.qbackend_layers[name]
        assert isinstance(rec, LayerRecord)
        for field in ("kind", "mode", "module", "post_op", "residual", "output", "shape", "x_shape", "forced",
                      "route_by_batch", "embedding"):
            assert getattr(rec, field) == getattr(new, field), (name, field)
        if new.route is not None:  # routed again on load: the route a conversion here gives
            assert rec.route == new.route, name
    assert loaded.qbackend_activations == fresh.qbackend_activations
    with torch.no_grad():
        assert torch.equal(loaded(*batch), fresh(*batch))
