"""Tune mode end to end: convert(tune=True) times the providers of every layer through the tuner,
stores the results, and a second convert of the same model reads them back without timing
anything; batch sizes; forced providers are not tuned; argument errors."""
from __future__ import annotations

import json
import re

import pytest
import torch

import qbackend
from qbackend.dispatch import tuner
from qbackend.dispatch.tuner import TuneCache
from qbackend.dispatch import routing
from qbackend.dispatch.tuner import TUNE_MARGIN
from qbackend.ops.providers import PROVIDERS

from .toy_models import ResidualCNN, init_bn, sqnr

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")

# Without VNNI in the hardware only the native GEMM multiplies full-range 8-bit activations exactly,
# so tune mode has one candidate per layer and times nothing (test_one_exact_candidate_is_not_timed);
# there the other tests calibrate 7-bit activations, which every provider multiplies exactly.
LIBRARIES_EXACT_8BIT = PROVIDERS["onednn"].exact_8bit("linear", {"m": 1, "k": 64, "n": 64})
CONFIG = qbackend.QuantConfig() if LIBRARIES_EXACT_8BIT else qbackend.QuantConfig(
    activation=qbackend.ObserverSpec("best_range", {"dtype": torch.uint8, "reduce_range": True}))


def _img(n, seed):
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def prepared():
    torch.manual_seed(0)
    model = init_bn(ResidualCNN())
    p = qbackend.prepare(model, (_img(2, 0),), config=CONFIG)
    p(_img(4, 1))
    return model, p


def test_tune_then_cached(prepared, tmp_path, monkeypatch):
    model, p = prepared
    path = tmp_path / "tune.json"
    q = qbackend.convert(p, tune=True, tune_cache=TuneCache(path))
    rows = qbackend.explain(q).rows
    layer_shapes = {name: info.shape for name, info in q.qbackend_layers.items()}
    assert len(rows) == 7 and all(r["why"].startswith("tuned: batch 2:") for r in rows)
    for r in rows:  # the fastest timed provider is the one chosen, or the rule's within the margin
        times = dict((p, float(t)) for p, t in re.findall(r"(native|fbgemm|onednn) ([0-9.]+) us", r["why"]))
        # the native provider is timed where it can run the layer (Linear, unpadded 1x1 convs; AVX512-VNNI)
        runs_native = PROVIDERS["native"].refuses(r["op"], layer_shapes[r["layer"]]) is None
        assert set(times) == {"fbgemm", "onednn"} | ({"native"} if runs_native else set()), r
        # the text rounds each time to 3 significant digits (at most 0.5% either way); rounding is
        # monotone, so the fastest stays the smallest shown, and the margin holds up to that rounding
        if "kept the rule's" in r["why"]:
            assert times[r["provider"]] <= min(times.values()) * TUNE_MARGIN * 1.005 / 0.995
        else:
            assert times[r["provider"]] == min(times.values())
    assert path.exists() and path.stat().st_size > 0
    # the exact times the tuner decided on, from the cache file: each choice is the fastest or
    # within the margin of it
    doc = json.loads(path.read_text())
    entries = [e for m in doc["machines"].values() for e in m["entries"].values()]
    assert entries
    for e in entries:
        t = e["times_us"]
        assert t[e["provider"]] <= min(t.values()) * TUNE_MARGIN, e

    def no_timing(*a, **k):
        raise AssertionError("a cached convert must not time anything")

    monkeypatch.setattr(tuner, "time_candidates", no_timing)
    q2 = qbackend.convert(p, tune=True, tune_cache=TuneCache(path))
    assert [r["provider"] for r in qbackend.explain(q2)] == [r["provider"] for r in rows]
    assert all("(cached)" in r["why"] for r in qbackend.explain(q2))
    x = _img(3, 5)
    with torch.no_grad():
        assert sqnr(model(x), q2(x)) > 25


def test_tune_batch_sizes(prepared, tmp_path):
    _, p = prepared
    q = qbackend.convert(p, tune=True, tune_batch_sizes=[1, 4], tune_cache=TuneCache(tmp_path / "t.json"))
    for r in qbackend.explain(q):
        assert "batch 1:" in r["why"] and "batch 4:" in r["why"]


def test_forced_provider_is_not_tuned(tmp_path):
    model = init_bn(ResidualCNN())
    p = qbackend.prepare(model, (_img(2, 0),), config=qbackend.QuantConfig(provider="onednn"))
    p(_img(4, 1))
    q = qbackend.convert(p, tune=True, tune_cache=TuneCache(tmp_path / "t.json"))
    assert {r["provider"] for r in qbackend.explain(q)} == {"onednn"}
    assert all("forced" in r["why"] for r in qbackend.explain(q))


def test_forced_by_environment_is_not_tuned(prepared, tmp_path, monkeypatch):
    _, p = prepared
    monkeypatch.setenv("QBACKEND_PROVIDER", "fbgemm")

    def no_timing(*a, **k):
        raise AssertionError("a forced provider must not be timed")

    monkeypatch.setattr(tuner, "time_candidates", no_timing)
    q = qbackend.convert(p, tune=True, tune_cache=TuneCache(tmp_path / "t.json"))
    assert {r["provider"] for r in qbackend.explain(q)} == {"fbgemm"}
    assert all("forced (QBACKEND_PROVIDER)" in r["why"] for r in qbackend.explain(q))


@pytest.mark.parametrize("slower", [1.02, 1.2])
def test_tune_keeps_the_rule_within_the_margin(prepared, tmp_path, monkeypatch, slower):
    _, p = prepared
    rules_q = qbackend.convert(p)
    rule = {r["layer"]: r["provider"] for r in qbackend.explain(rules_q)}
    # every layer: the rule's provider `slower` x the other one
    calls = []

    def fake(fns, **timing):
        calls.append(1)
        layer_rule = current[0]
        return {q: 100.0 * (slower if q == layer_rule else 1.0) for q in fns}

    current = [None]
    real_tune_route = routing.tune_route

    def tuned(request, candidates, rule_provider=None):
        current[0] = rule_provider
        return real_tune_route(request, candidates, rule_provider)

    monkeypatch.setattr(tuner, "time_candidates", fake)
    monkeypatch.setattr(routing, "tune_route", tuned)
    q = qbackend.convert(p, tune=True, tune_cache=TuneCache(tmp_path / "t.json"))
    assert calls
    for r in qbackend.explain(q):
        if slower <= TUNE_MARGIN:
            assert r["provider"] == rule[r["layer"]] and "kept the rule's" in r["why"]
        else:
            assert r["provider"] != rule[r["layer"]] and "kept" not in r["why"]


def test_tune_argument_errors(prepared):
    _, p = prepared
    with pytest.raises(ValueError, match="apply with tune=True"):
        qbackend.convert(p, tune_batch_sizes=[1])
    with pytest.raises(ValueError, match="positive batch sizes"):
        qbackend.convert(p, tune=True, tune_batch_sizes=[0])


@pytest.mark.parametrize("bad", [0.0, -1.0, "fast"])
def test_corrupt_cached_times_are_ignored_with_a_warning_and_measured_again(tmp_path, bad):
    import json
    import warnings

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16)).eval()
    x = torch.randn(8, 32)
    p = qbackend.prepare(model, (x,), config=CONFIG)
    p(x)
    path = tmp_path / "tune.json"
    qbackend.convert(p, tune=True, tune_cache=TuneCache(path))
    doc = json.loads(path.read_text())
    (section,) = doc["machines"].values()
    (key,) = section["entries"]
    for provider in section["entries"][key]["times_us"]:
        section["entries"][key]["times_us"][provider] = bad
    path.write_text(json.dumps(doc))
    with pytest.warns(tuner.TuneCacheWarning) as record:
        q = qbackend.convert(p, tune=True, tune_cache=TuneCache(path))
    messages = [str(w.message) for w in record if issubclass(w.category, tuner.TuneCacheWarning)]
    assert any(str(path) in m and key in m for m in messages), messages
    (row,) = qbackend.explain(q).rows
    assert row["why"].startswith("tuned: batch 8:") and "(cached)" not in row["why"]
    times = [float(t) for t in re.findall(r"(?:native|fbgemm|onednn) ([0-9.]+) us", row["why"])]
    assert times and all(t > 0 for t in times)
    stored = json.loads(path.read_text())["machines"]
    assert all(t > 0 for s in stored.values() for e in s["entries"].values() for t in e["times_us"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", tuner.TuneCacheWarning)  # the rewritten file is valid
        qbackend.convert(p, tune=True, tune_cache=TuneCache(path))
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 30


def test_one_exact_candidate_is_not_timed(monkeypatch):
    # 8-bit activations where only the native GEMM runs them exactly (every CPU without VNNI; here
    # the libraries are excluded): the rule's route, saying why nothing was timed
    def no_timing(*a, **k):
        raise AssertionError("a single candidate must not be timed")

    monkeypatch.setattr(tuner, "time_candidates", no_timing)
    request = tuner.TuneRequest(tuner.TuneOptions(), "linear", 1, lambda b: {"m": b, "k": 64, "n": 64}, {},
                                lambda provider, b: no_timing)
    shape = {"m": 1, "k": 64, "n": 64}
    r = routing.route("linear", shape, tune=request, exclude=("fbgemm", "onednn"))
    assert r.provider == "native" and r.source == "rule"
    assert r.why.endswith("; not tuned: only native runs it with 8-bit activations exactly here"), r.why
    r7 = routing.route("linear", shape, eight_bit_input=False, tune=request, exclude=("fbgemm", "onednn"))
    assert r7.why.endswith("; not tuned: only native runs it here"), r7.why
