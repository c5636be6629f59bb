"""No wasted work in the converted CNN graphs: shape queries read the int8 form of a value (no
dequantize + float max pool kept alive for a flatten's shape), and a flatten of a channels-last
int8 activation read only by Linears runs as a view of the NHWC memory (no copy), with the Linear's
weight columns permuted so that the outputs stay bit-identical. Checked on the digits CNN and a
small conv -> relu -> maxpool -> flatten -> linear model at batches 1, 3 and 7, through the
profiler, qbackend.save / load, torch.compile and torch.export."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.lowering import nhwc_flatten
from qbackend.models import MODELS
from qbackend.nn import QuantizedLinear
from qbackend.nn.quant import Dequantize

pytestmark = [pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning"),
              pytest.mark.usefixtures("one_thread")]
aten = torch.ops.aten
BATCHES = (1, 3, 7)


class ConvPoolLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def _images(n, seed):
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _fp32_model(name):
    if name == "digits_cnn":
        return MODELS["digits_cnn"](batch_size=1).model.eval()
    torch.manual_seed(0)
    return ConvPoolLinear().eval()


def _convert(name, enabled=True):
    old, nhwc_flatten._ENABLED = nhwc_flatten._ENABLED, enabled
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name == "digits_cnn":
                case = MODELS["digits_cnn"](batch_size=1)
                x = torch.cat([b[0] for b in case.evaluation])[:max(BATCHES)]
                return qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration), x
            torch.manual_seed(0)
            model = ConvPoolLinear().eval()
            q = qbackend.quantize(model, (_images(1, 0),), [(_images(4, 10 + i),) for i in range(3)])
            return q, _images(max(BATCHES), 99)
    finally:
        nhwc_flatten._ENABLED = old


@pytest.fixture(scope="module", params=["digits_cnn", "conv_pool_linear"])
def converted(request):
    q, x = _convert(request.param)
    ref, _ = _convert(request.param, enabled=False)
    return q, ref, x, request.param


def test_column_order_is_the_nhwc_flatten_of_the_weight():
    g = torch.Generator().manual_seed(1)
    n, c, h, w, out = 3, 5, 2, 3, 4
    x = torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.int64)
    weight = torch.randint(-127, 128, (out, c * h * w), generator=g, dtype=torch.int64)
    perm = nhwc_flatten.column_order(c, h * w)
    assert sorted(perm.tolist()) == list(range(c * h * w))
    nchw = x.reshape(n, -1) @ weight.t()
    nhwc = x.permute(0, 2, 3, 1).reshape(n, -1) @ weight[:, perm].t()
    assert torch.equal(nchw, nhwc)
    assert not torch.equal(perm, torch.arange(c * h * w))


def test_graph_has_no_dequantize_nor_float_max_pool(converted):
    q, ref, _, _ = converted
    gm = q.graph_module
    nodes = list(gm.graph.nodes)
    assert not any(n.op == "call_module" and isinstance(gm.get_submodule(n.target), Dequantize) for n in nodes)
    assert not any(n.op == "call_function" and n.target is aten.max_pool2d.default for n in nodes)
    assert sum(n.target is torch.ops.qbackend.max_pool2d.default for n in nodes) == 1
    # the flatten reads the int8 max pool's NHWC memory; the reference keeps the NCHW order
    assert sum(n.target is aten.permute.default for n in nodes) == 1
    assert not any(n.target is aten.permute.default for n in ref.graph_module.graph.nodes)
    fc = [m for m in q.modules() if isinstance(m, QuantizedLinear)]
    fc_ref = [m for m in ref.modules() if isinstance(m, QuantizedLinear)]
    assert len(fc) == len(fc_ref) == 1
    w, w_ref = fc[0].packed.weight, fc_ref[0].packed.weight
    assert not torch.equal(w, w_ref) and torch.equal(w.sort(dim=1).values, w_ref.sort(dim=1).values)


def _copies(model, x):
    """The input shapes of every copy (clone, copy_, contiguous) one forward made."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                 record_shapes=True) as prof:
        model(x)
    events = prof.key_averages(group_by_input_shape=True)
    assert any(e.key == "qbackend::max_pool2d" for e in events)
    return [e.input_shapes[0] for e in events if e.key in ("aten::clone", "aten::copy_", "aten::contiguous")
            for _ in range(e.count)]


def test_forward_copies_nothing_but_the_model_input(converted):
    """The only copy left is the conv's NCHW model input reordered to channels-last (with more
    than one input channel); the reference flattens the channels-last pooled output by a copy."""
    q, ref, x, _ = converted
    for n in BATCHES:
        assert all(shape == list(x[:n].shape) for shape in _copies(q, x[:n])), n
    pooled = [s for s in _copies(ref, x[:1]) if s != list(x[:1].shape)]
    assert pooled and all(len(s) == 4 and s[0] == 1 for s in pooled)


def test_outputs_bit_identical_to_the_nchw_order(converted):
    q, ref, x, _ = converted
    with torch.no_grad():
        for n in BATCHES:
            a, b = q(x[:n]), ref(x[:n])
            assert a.shape[0] == n and a.dtype == b.dtype and torch.equal(a, b)


def test_save_load_round_trip(converted, tmp_path):
    q, _, x, _ = converted
    qbackend.save(q, tmp_path / "m.qb")
    loaded = qbackend.load(tmp_path / "m.qb")
    assert any(n.target is aten.permute.default for n in loaded.graph_module.graph.nodes)
    with torch.no_grad():
        for n in BATCHES:
            assert torch.equal(loaded(x[:n]), q(x[:n]))
    assert [dict(r) for r in qbackend.explain(loaded)] == [dict(r) for r in qbackend.explain(q)]
    assert str(qbackend.explain(q))
    fc = [m for m in loaded.modules() if isinstance(m, QuantizedLinear)]
    assert [m.x_nhwc for m in fc] == [m.x_nhwc for m in q.modules() if isinstance(m, QuantizedLinear)] != [None]


def test_compare_runs_the_linear_alone_on_its_fp32_input_in_its_order(converted):
    """compare's per-layer SQNRs (at its place, and alone on the FP32 input) are those of the
    model with the NCHW order: the same integers reach the same sums."""
    q, ref, x, name = converted
    fp32 = _fp32_model(name)
    data = [(x[:3],), (x[3:],)]
    got, want = qbackend.compare(fp32, q, data), qbackend.compare(fp32, ref, data)
    assert [(r.name, r.sqnr_db, r.local_sqnr_db) for r in got.layers] == \
        [(r.name, r.sqnr_db, r.local_sqnr_db) for r in want.layers]
    assert all(r.local_sqnr_db is not None and r.local_sqnr_db > 15 for r in got.layers)


def test_compile_and_export(converted):
    q, _, x, _ = converted
    with torch.no_grad():
        for n in BATCHES:
            ref = q(x[:n])
            assert torch.equal(torch.compile(q, fullgraph=True, backend="eager")(x[:n]), ref)
        ep = torch.export.export(q, (x[:3],), strict=False)
        assert torch.equal(ep.module()(x[:3]), q(x[:3]))
