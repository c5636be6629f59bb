"""Tests of the observers' behaviour: the NaN/inf policy, empty tensors, the no-data error, inputs,
state_dict round trips (also through torch.save/load), load validation, merge rules and the
moving average's approximate merge, the histogram's canonical geometry, Percentile against
numpy.percentile, MSE against min/max by its own objective, torch.ao's HistogramObserver as a
peer, and every bad argument."""
from __future__ import annotations

import io
import math
import warnings

import numpy as np
import pytest
import torch

from qbackend.observers import (OBSERVER_CLASSES, BestRangeObserver, HistogramObserver, MinMaxObserver,
                                MovingAverageMinMaxObserver, MSEObserver, NonFiniteWarning, Observer, ObserverError,
                                PercentileObserver, PerChannelMinMaxObserver, choose_qparams)
from qbackend.observers.histogram import _bin, _k_floor, required_log2_width

from .test_merge import state_equal

ALL = list(OBSERVER_CLASSES.values())


def make(cls, **kw):
    kw.setdefault("name", "block.3.act")
    if cls is not PerChannelMinMaxObserver:
        kw.setdefault("reduce_range", False)
    return cls(**kw)


def data(seed=0, shape=(64, 50), scale=2.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def with_nonfinite(x, n_nan=3, n_inf=2):
    x = x.clone().flatten()
    x[:n_nan] = float("nan")
    x[n_nan:n_nan + n_inf] = float("inf")
    x[n_nan + n_inf] = -float("inf")
    return x.reshape(64, 50)


# ----------------------------------------------------------------------------- forward-pass use, inputs

@pytest.mark.parametrize("cls", ALL)
def test_update_returns_input_and_accepts_layouts(cls):
    obs = make(cls)
    x = data()
    assert obs.update(x) is x and obs(x) is x
    ref = make(cls)
    ref.update(x)
    ref.update(x)
    assert state_equal(obs.state_dict(), ref.state_dict())
    other = make(cls)  # transposed / strided / float16 / bfloat16 inputs of the same values
    other.update(x.t().contiguous().t())
    other.update(x[:, ::2].clone() if False else x)
    assert state_equal(other.state_dict(), ref.state_dict())
    h = make(cls)
    xh = x.half()
    h.update(xh)
    h2 = make(cls)
    h2.update(xh.float())
    assert state_equal(h.state_dict(), h2.state_dict())
    b = make(cls)
    b.update(x.bfloat16())
    b2 = make(cls)
    b2.update(x.bfloat16().float())
    assert state_equal(b.state_dict(), b2.state_dict())


def test_requires_grad_and_channels_last():
    x = data(1, (2, 3, 4, 5)).requires_grad_()
    obs = make(PerChannelMinMaxObserver, axis=1)
    assert obs.update(x) is x
    cl = make(PerChannelMinMaxObserver, axis=1)
    cl.update(x.detach().to(memory_format=torch.channels_last))
    assert state_equal(obs.state_dict(), cl.state_dict())
    h = make(HistogramObserver)
    h.update(x)
    assert h.count == x.numel()


# ----------------------------------------------------------------------------- NaN / inf

@pytest.mark.parametrize("cls", ALL)
def test_reset_of_a_shallow_copy_leaves_the_original(cls):
    """reset assigns new statistics: a shallow copy, reset and fed other data, leaves the
    observer it was copied from as it was (SmoothQuant's search makes its fresh observers so)."""
    import copy

    obs = make(cls)
    obs.update(data(0))
    before = obs.state_dict()
    fresh = copy.copy(obs)
    fresh.reset()
    assert not fresh.has_data
    fresh.update(data(1, scale=7.0))
    assert state_equal(obs.state_dict(), before)
    assert not state_equal(fresh.state_dict(), before)


@pytest.mark.parametrize("cls", ALL)
def test_nonfinite_skipped_counted_warned_once(cls):
    obs = make(cls)
    clean = make(cls)
    x = data()
    with pytest.warns(NonFiniteWarning, match=r"block\.3\.act.*skipped 6 non-finite.*\(6 so far\)"):
        obs.update(with_nonfinite(x))
    assert obs.nonfinite_count == 6 and obs.count == x.numel() - 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        obs.update(with_nonfinite(x, 1, 0))
    assert obs.nonfinite_count == 8
    # the same statistics as without the non-finite values
    if cls is not PerChannelMinMaxObserver:  # per-channel: dropping values would reshape the input
        for v in (with_nonfinite(x), with_nonfinite(x, 1, 0)):
            clean.update(v[torch.isfinite(v)])
        sd, sd_clean = obs.state_dict(), clean.state_dict()
        assert sd["stats"].pop("nonfinite") == 8 and sd_clean["stats"].pop("nonfinite") == 0
        assert state_equal(sd, sd_clean)
    q = obs.compute_qparams()
    assert (math.isfinite(q.scale) if not q.per_channel else bool(torch.isfinite(q.scale).all()))
    # merge sums the counts
    other = make(cls)
    with pytest.warns(NonFiniteWarning):
        other.update(with_nonfinite(x))
    assert obs.merge(other).nonfinite_count == 14


@pytest.mark.parametrize("cls", ALL)
def test_nonfinite_raise_leaves_observer_unchanged(cls):
    obs = make(cls, nonfinite="raise")
    obs.update(data(1))
    before = obs.state_dict()
    with pytest.raises(ObserverError, match=r"block\.3\.act.*6 non-finite.*nonfinite='raise'"):
        obs.update(with_nonfinite(data(2)))
    assert state_equal(before, obs.state_dict())
    assert isinstance(ObserverError("x"), ValueError)


@pytest.mark.parametrize("cls", ALL)
def test_only_nonfinite_then_no_data_error(cls):
    obs = make(cls)
    with pytest.warns(NonFiniteWarning):
        obs.update(torch.full((4, 5), float("nan")))
    assert not obs.has_data and obs.nonfinite_count == 20
    with pytest.raises(ObserverError, match=r"'block\.3\.act' saw no calibration data \(only 20 non-finite"):
        obs.compute_qparams()


# ----------------------------------------------------------------------------- empty / no data

@pytest.mark.parametrize("cls", ALL)
def test_empty_tensor_is_noop_and_no_data_names_observer(cls):
    obs = make(cls, name="encoder.layer.7.output")
    for shape in [(0,), (3, 0), (0, 4, 5)]:
        obs.update(torch.empty(shape))
    assert obs.count == 0 and state_equal(obs.state_dict(), make(cls, name="x").state_dict())
    with pytest.raises(ObserverError, match=r"'encoder\.layer\.7\.output' saw no calibration data"):
        obs.compute_qparams()
    with pytest.raises(ObserverError, match="encoder.layer.7.output"):
        obs.chosen_range()
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        obs.update(torch.empty(0, dtype=torch.int64))  # still checked
    unnamed = cls() if cls is PerChannelMinMaxObserver else cls(reduce_range=False)
    with pytest.raises(ObserverError, match=r"\(unnamed\) saw no calibration data"):
        unnamed.compute_qparams()


def test_per_channel_channel_without_data():
    obs = make(PerChannelMinMaxObserver, axis=1)
    x = data(0, (10, 4))
    x[:, 2] = float("nan")
    with pytest.warns(NonFiniteWarning):
        obs.update(x)
    with pytest.raises(ObserverError, match=r"block\.3\.act.*1 channel\(s\) along axis 1.*: 2"):
        obs.compute_qparams()


# ----------------------------------------------------------------------------- state_dict

def fed(cls, seeds=(0, 1), **kw):
    obs = make(cls, **kw)
    for s in seeds:
        obs.update(data(s, scale=1.0 + s))
    return obs


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("with_data", [True, False])
def test_state_dict_round_trip_through_torch_save(cls, with_data):
    obs = fed(cls) if with_data else make(cls)
    sd = obs.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf)  # weights_only=True by default: plain values and tensors only
    assert state_equal(sd, loaded)
    fresh = make(cls).load_state_dict(loaded)
    assert state_equal(fresh.state_dict(), sd)
    again = Observer.from_state_dict(loaded, name="n")
    assert type(again) is cls and again.name == "n" and state_equal(again.state_dict(), sd)
    assert cls.from_state_dict(loaded).kind == cls.kind
    if with_data:
        assert fresh.compute_qparams() == obs.compute_qparams() == again.compute_qparams()
        # calibration continues after a reload exactly as without it
        obs.update(data(5, scale=9.0))
        fresh.update(data(5, scale=9.0))
        assert state_equal(obs.state_dict(), fresh.state_dict())
    # the state_dict is a copy: changing the observer later does not change it
    assert state_equal(loaded, sd)


def _mutated(sd, path, value):
    import copy

    sd = copy.deepcopy(sd)
    d = sd
    for k in path[:-1]:
        d = d[k]
    if value is KeyError:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return sd


HIST_BAD = [
    (("kind",), "MinMaxObserver", "of a 'MinMaxObserver', not of a HistogramObserver"),
    (("version",), 2, "state_dict has version 2; this qbackend reads version 1"),
    (("version",), "1", r"state_dict is malformed: its 'version' field must be an int, got '1' \(str\)"),
    (("version",), True, r"'version' field must be an int, got True \(bool\)"),
    (("config",), KeyError, "keys must be"),
    (("extra",), 1, "keys must be"),
    (("config", "bins"), 512, "config differs in bins"),
    (("config", "symmetric"), True, "config differs in symmetric"),
    (("stats", "counts"), KeyError, "stats keys must be"),
    (("stats", "counts"), torch.zeros(2048), "CPU int64 tensor of shape"),
    (("stats", "counts"), torch.zeros(100, dtype=torch.int64), "CPU int64 tensor of shape"),
    (("stats", "count"), -1, "int >= 0"),
    (("stats", "count"), 1.5, "int >= 0"),
    (("stats", "count"), 7, "sum to"),
    (("stats", "min_val"), float("nan"), "finite float"),
    (("stats", "min_val"), 1, "finite float"),
    (("stats", "min_val"), 100.0, "min .* > max"),
    (("stats", "min_val"), 0.1, "float32 values"),
    (("stats", "log2_width"), 3, "not the canonical"),
    (("stats", "offset"), 1, "not the canonical"),
]


@pytest.mark.parametrize("path,value,text", HIST_BAD)
def test_histogram_load_validation(path, value, text):
    obs = fed(HistogramObserver)
    good = obs.state_dict()
    target = make(HistogramObserver)
    target.update(data(9))
    before = target.state_dict()
    with pytest.raises((ValueError, TypeError), match=text):
        target.load_state_dict(_mutated(good, path, value))
    assert state_equal(before, target.state_dict())  # unchanged


def test_histogram_load_validation_mass_and_empty():
    obs = fed(HistogramObserver)
    sd = obs.state_dict()
    counts = sd["stats"]["counts"].clone()
    last = int(counts.nonzero().max())
    counts[last] -= 1
    counts[last + 1] += 1  # mass past the bin of max
    with pytest.raises(ValueError, match="mass exactly in bins"):
        make(HistogramObserver).load_state_dict(_mutated(sd, ("stats", "counts"), counts))
    empty = make(HistogramObserver).state_dict()
    with pytest.raises(ValueError, match="None when count is 0"):
        make(HistogramObserver).load_state_dict(_mutated(empty, ("stats", "log2_width"), 3))
    with pytest.raises(TypeError, match="must be a dict"):
        make(HistogramObserver).load_state_dict([("kind", 1)])
    with pytest.raises(ValueError, match="kind 'Nope' is not a"):
        Observer.from_state_dict(_mutated(sd, ("kind",), "Nope"))
    with pytest.raises(ValueError, match="is not a MinMaxObserver"):
        MinMaxObserver.from_state_dict(sd)
    with pytest.raises(ValueError, match="dtype must be 'uint8' or 'int8'"):
        Observer.from_state_dict(_mutated(sd, ("config", "dtype"), "float32"))
    with pytest.raises(ValueError, match="does not fit HistogramObserver"):
        Observer.from_state_dict(_mutated(sd, ("config", "percentile"), 99.0))


@pytest.mark.parametrize("cls,path,value,text", [
    (MinMaxObserver, ("stats", "max_val"), None, "finite float"),
    (MinMaxObserver, ("stats", "min_val"), "0", "finite float"),
    (MovingAverageMinMaxObserver, ("stats", "batches"), 0, "batches"),
    (MovingAverageMinMaxObserver, ("config", "averaging_constant"), 0.5, "config differs in averaging_constant"),
    (PerChannelMinMaxObserver, ("stats", "min_val"), torch.zeros(3, dtype=torch.float64), "1-D float32"),
    (PerChannelMinMaxObserver, ("stats", "min_val"), torch.zeros(3), "differ in shape"),
    (PerChannelMinMaxObserver, ("stats", "min_val"), torch.full((64,), 100.0), "min <= max"),
    (PerChannelMinMaxObserver, ("stats", "count"), 0, "count does not match"),
    (PerChannelMinMaxObserver, ("config", "axis"), 1, "config differs in axis"),
    (PercentileObserver, ("config", "percentile"), 99.0, "config differs in percentile"),
    (MSEObserver, ("config", "candidates"), 7, "config differs in candidates"),
])
def test_load_validation_other_kinds(cls, path, value, text):
    sd = fed(cls).state_dict()
    target = make(cls)
    with pytest.raises((ValueError, TypeError), match=text):
        target.load_state_dict(_mutated(sd, path, value))
    assert target.count == 0


# ----------------------------------------------------------------------------- merge rules

@pytest.mark.parametrize("cls", ALL)
def test_merge_rules(cls):
    a, b = fed(cls, (0,)), fed(cls, (1,))
    assert a.merge(b) is a
    both = fed(cls, (0, 1))
    if cls is not MovingAverageMinMaxObserver:
        assert state_equal(a.state_dict(), both.state_dict())
    # empty into data and data into empty
    c = fed(cls, (0,))
    c.merge(make(cls))
    assert state_equal(c.state_dict(), fed(cls, (0,)).state_dict())
    e = make(cls).merge(fed(cls, (0,)))
    assert state_equal(e.state_dict(), fed(cls, (0,)).state_dict())
    other_kind = next(k for k in ALL if k is not cls)
    with pytest.raises(TypeError, match=f"cannot merge a {other_kind.kind}"):
        a.merge(make(other_kind))
    with pytest.raises(TypeError):
        a.merge("not an observer")
    kw = {"dtype": torch.uint8} if cls is PerChannelMinMaxObserver else {"symmetric": True}
    with pytest.raises(ValueError, match="different configs"):
        a.merge(make(cls, **kw))


def test_merge_ignores_name_and_policy():
    a = make(HistogramObserver, name="a", nonfinite="raise")
    b = make(HistogramObserver, name="b")
    b.update(data())
    a.merge(b)
    assert a.count == b.count and a.name == "a"


def test_per_channel_merge_channel_mismatch():
    a, b = make(PerChannelMinMaxObserver), make(PerChannelMinMaxObserver)
    a.update(data(0, (4, 5)))
    b.update(data(1, (3, 5)))
    with pytest.raises(ValueError, match="3 channels into .* with 4"):
        a.merge(b)
    with pytest.raises(ValueError, match="has 3 channels along axis 0, the observer has 4"):
        a.update(data(1, (3, 5)))


def test_moving_average_semantics_and_envelope_merge():
    c = 0.25
    a = make(MovingAverageMinMaxObserver, averaging_constant=c)
    batches = [data(s, (10, 10), scale=1.0 + s) for s in range(4)]
    mn, mx = float(batches[0].min()), float(batches[0].max())
    for i, x in enumerate(batches):
        a.update(x)
        if i:
            mn += c * (float(x.min()) - mn)
            mx += c * (float(x.max()) - mx)
    assert (a.min_val, a.max_val, a.batches) == (pytest.approx(mn, rel=1e-15), pytest.approx(mx, rel=1e-15), 4)
    with pytest.warns(NonFiniteWarning):
        a.update(torch.full((3,), float("nan")))  # no finite values: the averages do not move
    assert a.batches == 4
    b = make(MovingAverageMinMaxObserver, averaging_constant=c)
    b.update(data(9, (10, 10), scale=0.1))
    b.update(data(10, (10, 10), scale=20.0))
    amin, amax, bmin, bmax = a.min_val, a.max_val, b.min_val, b.max_val
    a.merge(b)  # documented: the envelope of the two running ranges; batch counts add
    assert (a.min_val, a.max_val) == (min(amin, bmin), max(amax, bmax)) and a.batches == 6
    assert a.count == 400 + 200


# ----------------------------------------------------------------------------- histogram geometry

@pytest.mark.parametrize("lo,hi,bins", [(0.0, 1.0, 2048), (-3.0, 5.5, 16), (1000.0, 1000.0001, 64), (0.0, 0.0, 2048),
                                        (-1e-40, 1e-38, 2048), (-3.4e38, 3.4e38, 2048), (2.5, 2.5, 16),
                                        (-7.0, -6.99, 17), (1e-45, 1e-45, 16)])
def test_required_log2_width_is_minimal(lo, hi, bins):
    k = required_log2_width(lo, hi, bins)
    assert _bin(hi, k) - _bin(lo, k) <= bins - 1
    assert k == _k_floor(max(abs(lo), abs(hi))) or _bin(hi, k - 1) - _bin(lo, k - 1) > bins - 1
    assert abs(_bin(lo, k)) < 2**36 and abs(_bin(hi, k)) < 2**36
    for wider in ((lo - abs(lo) - 1, hi), (lo, hi + 2 * abs(hi) + 1)):  # monotone
        assert required_log2_width(*wider, bins) >= k


def test_histogram_state_is_canonical():
    x = torch.cat([data(0).flatten(), torch.tensor([40.0, -0.001])])
    obs = make(HistogramObserver, bins=256)
    for chunk in x.split(333):
        obs.update(chunk)
    k = required_log2_width(float(x.min()), float(x.max()), 256)
    assert (obs.log2_width, obs.offset) == (k, _bin(float(x.min()), k))
    edges = obs.bin_edges().numpy()
    assert np.array_equal(obs.counts.numpy(), np.histogram(x.double().numpy(), bins=edges)[0])
    lower, upper = obs.bin_bounds()
    assert float(lower[0]) == obs.min_val and float(upper[-1]) <= obs.max_val


def test_histogram_range_clips_outliers_and_never_loses_to_minmax():
    g = torch.Generator().manual_seed(3)
    # L2 clips an outlier once the rounding error it causes (~ n * (range / 256)^2 / 12) exceeds its
    # own clipping error: 10^6 values ~ N(0, 1) and one at 60
    x = torch.cat([torch.randn(1_000_000, generator=g), torch.tensor([60.0])])
    obs = make(HistogramObserver)
    obs.update(x)
    lo, hi = obs.chosen_range()
    assert obs.min_val <= lo < hi <= obs.max_val and hi < 6.0  # the outlier is clipped
    minmax = choose_qparams(obs.min_val, obs.max_val)
    assert obs.quantization_error(obs.compute_qparams()) < obs.quantization_error(minmax)
    # uniform data plus one far outlier: the first quantile step jumps from the outlier's bin past
    # the top of the data; torch.ao would take that step unconditionally (its error starts at +inf,
    # float32 rounding happens to save it here), ours must beat the full range first
    u = make(HistogramObserver)
    u.update(torch.cat([torch.rand(100000, generator=g), torch.tensor([1000.0])]))
    assert u.chosen_range() == (u.min_val, u.max_val)
    assert u.quantization_error(u.compute_qparams()) <= u.quantization_error(choose_qparams(u.min_val, u.max_val))
    with pytest.raises(ValueError, match="per-tensor"):
        obs.quantization_error(choose_qparams(torch.zeros(2), torch.ones(2), axis=0))


@pytest.mark.parametrize("seed,kind", [(0, "relu"), (1, "gelu"), (2, "normal")])
def test_histogram_peer_torch_ao(seed, kind):
    """One batch (torch.ao's histogram is then exact too): the two searches pick ranges within two
    of torch.ao's bins (ours are up to 2x wider than theirs; the benchmark checks the full setup)."""
    from torch.ao.quantization import HistogramObserver as AoHistogramObserver

    g = torch.Generator().manual_seed(seed)
    z = torch.randn(200000, generator=g)
    x = {"relu": torch.relu(z) * 3, "gelu": torch.nn.functional.gelu(z * 4), "normal": z}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ao = AoHistogramObserver(reduce_range=False)
        ao(x)
        ao_lo, ao_hi = (float(v) for v in ao._non_linear_param_search())
    obs = make(HistogramObserver)
    obs.update(x)
    lo, hi = obs.chosen_range()
    w = (float(ao.max_val) - float(ao.min_val)) / ao.bins
    assert abs(lo - ao_lo) <= 2 * w and abs(hi - ao_hi) <= 2 * w, (lo, hi, ao_lo, ao_hi, w)


# ----------------------------------------------------------------------------- percentile, MSE

@pytest.mark.parametrize("p", [99.99, 99.0, 90.0, 100.0])
@pytest.mark.parametrize("kind", ["normal", "lognormal", "relu", "negative"])
def test_percentile_vs_numpy(p, kind):
    rng = np.random.default_rng(7)
    z = rng.standard_normal(200001)
    x = {"normal": z * 3, "lognormal": np.exp(z * 2), "relu": np.maximum(z, 0), "negative": -np.exp(z)}[kind]
    x = x.astype(np.float32)
    obs = make(PercentileObserver, percentile=p)
    for part in np.array_split(x, 3):
        obs.update(torch.from_numpy(part))
    lo, hi = obs.chosen_range()
    w = math.ldexp(1.0, obs.log2_width)
    xd = x.astype(np.float64)
    assert abs(lo - np.percentile(xd, 100 - p)) <= w and abs(hi - np.percentile(xd, p)) <= w
    if p == 100.0:
        assert (lo, hi) == (float(x.min()), float(x.max()))
    assert obs.compute_qparams() == choose_qparams(lo, hi, reduce_range=False)


def test_percentile_symmetric_and_constant():
    obs = make(PercentileObserver, symmetric=True, dtype=torch.int8)
    obs.update(torch.full((1000,), -2.5))
    assert obs.chosen_range() == (-2.5, -2.5)
    qp = obs.compute_qparams()
    assert qp.zero_point == 0 and qp.scale == float(np.float32(2.5 / 127.5))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", ["normal", "outliers", "relu", "uniform"])
def test_mse_no_worse_than_minmax(symmetric, kind):
    g = torch.Generator().manual_seed(4)
    z = torch.randn(100000, generator=g)
    x = {"normal": z, "outliers": torch.cat([z, torch.tensor([60.0, -45.0])]), "relu": torch.relu(z) ** 3,
         "uniform": torch.rand(100000, generator=g)}[kind]
    obs = make(MSEObserver, symmetric=symmetric)
    obs.update(x)
    qp = obs.compute_qparams()
    minmax = choose_qparams(obs.min_val, obs.max_val, symmetric=symmetric)
    assert obs.quantization_error(qp) <= obs.quantization_error(minmax)
    los, his, err = obs.candidate_errors()
    assert los.shape == (100,) and (float(los[0]), float(his[0])) == (
        (min(obs.min_val, 0.0), max(obs.max_val, 0.0)) if not symmetric else
        (-max(-min(obs.min_val, 0.0), obs.max_val), max(-min(obs.min_val, 0.0), obs.max_val)))
    assert obs.quantization_error(qp) == pytest.approx(float(err.min()), rel=1e-12)
    if kind == "outliers":  # clipping the two outliers pays (their clipping error bounds the gain)
        assert obs.quantization_error(qp) < 0.9 * obs.quantization_error(minmax)
    # the real round trip agrees: MSE's qparams give less error on the data itself than min/max
    from qbackend.ops import dequantize, quantize

    def mse(q):
        return float((dequantize(quantize(x, q.scale, q.zero_point), q.scale, q.zero_point) - x).double().pow(2).mean())

    assert mse(qp) <= mse(minmax) * 1.01


# ----------------------------------------------------------------------------- configuration, bad arguments

def test_reset_and_repr_and_defaults():
    obs = fed(HistogramObserver)
    obs.reset()
    assert obs.count == 0 and obs.nonfinite_count == 0 and obs.log2_width is None
    assert "HistogramObserver(" in repr(obs) and "name='block.3.act'" in repr(obs)
    from qbackend.core.extension import _C

    default = HistogramObserver()
    assert default.bins == 2048 and default.dtype == torch.uint8 and not default.symmetric
    assert default.qmax == (255 if _C.native_isa() else 127)  # 8 bits wherever the native GEMM runs
    w = PerChannelMinMaxObserver()
    assert (w.dtype, w.symmetric, w.axis, w.qmin, w.qmax) == (torch.int8, True, 0, -128, 127)
    q = make(PerChannelMinMaxObserver)
    q.update(data(0, (8, 3, 3, 3)))
    qp = q.compute_qparams()
    assert qp.per_channel and qp.axis == 0 and qp.scale.shape == (8,) and bool((qp.zero_point == 0).all())


@pytest.mark.parametrize("cls,kwargs,exc,text", [
    (MinMaxObserver, dict(dtype=torch.float32), TypeError, "dtype must be torch.uint8 or torch.int8"),
    (MinMaxObserver, dict(dtype=torch.quint8), TypeError, "dtype must"),
    (MinMaxObserver, dict(nonfinite="ignore"), ValueError, "nonfinite must be one of 'skip', 'raise'"),
    (MinMaxObserver, dict(symmetric="yes"), TypeError, "symmetric must"),
    (MinMaxObserver, dict(name=3), TypeError, "name must"),
    (MinMaxObserver, dict(eps=-1.0), ValueError, "eps must"),
    (MinMaxObserver, dict(dtype=torch.int8, reduce_range=True), ValueError, "reduce_range applies to uint8"),
    (MinMaxObserver, dict(qmin=5, qmax=5), ValueError, "qmin < qmax"),
    (MinMaxObserver, dict(bins=100), TypeError, "unexpected keyword"),
    (MovingAverageMinMaxObserver, dict(averaging_constant=0.0), ValueError, "averaging_constant must be in"),
    (MovingAverageMinMaxObserver, dict(averaging_constant=1.5), ValueError, "averaging_constant must be in"),
    (PerChannelMinMaxObserver, dict(axis="0"), TypeError, "axis must be an int"),
    (HistogramObserver, dict(bins=8), ValueError, "bins must be in"),
    (HistogramObserver, dict(bins=1 << 21), ValueError, "bins must be in"),
    (HistogramObserver, dict(bins=2048.0), TypeError, "bins must be an int"),
    (HistogramObserver, dict(percentile=99.0), TypeError, "unexpected keyword"),
    (PercentileObserver, dict(percentile=40.0), ValueError, "percentile must be in"),
    (PercentileObserver, dict(percentile=100.5), ValueError, "percentile must be in"),
    (PercentileObserver, dict(percentile="99"), ValueError, "percentile must be in"),
    (MSEObserver, dict(candidates=0), ValueError, "candidates must be in"),
    (MSEObserver, dict(candidates=2.5), TypeError, "candidates must be an int"),
])
def test_bad_constructor_arguments(cls, kwargs, exc, text):
    with pytest.raises(exc, match=text):
        cls(**kwargs)


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("bad,exc,text", [
    ([1.0, 2.0], TypeError, "expects a torch.Tensor, got list"),
    (torch.ones(3, dtype=torch.int32), TypeError, "float32, bfloat16 or float16 tensor, got torch.int32"),
    (torch.ones(3, dtype=torch.float64), TypeError, "got torch.float64"),
    (torch.ones(3, dtype=torch.uint8), TypeError, "got torch.uint8"),
    (torch.ones(3, device="meta"), ValueError, "CPU tensor, got device meta"),
    (torch.ones(3).to_sparse(), TypeError, "dense"),
])
def test_bad_update_input(cls, bad, exc, text):
    obs = make(cls)
    with pytest.raises(exc, match=rf"block\.3\.act.*{text}" if "(" not in text else text):
        obs.update(bad)
    assert obs.count == 0


def test_per_channel_axis_errors():
    obs = make(PerChannelMinMaxObserver, axis=2)
    with pytest.raises(ValueError, match=r"axis 2 does not index an input with 2 dimension"):
        obs.update(torch.ones(3, 4))
    with pytest.raises(ValueError, match="axis 2 does not index"):
        obs.update(torch.tensor(1.0))
    neg = make(PerChannelMinMaxObserver, axis=-1)
    neg.update(torch.ones(3, 4))
    assert neg.channels == 4 and neg.compute_qparams().axis == -1


@pytest.mark.parametrize("dtype,symmetric", [(torch.uint8, False), (torch.uint8, True), (torch.int8, False),
                                             (torch.int8, True)])
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e30])
def test_minmax_qparams_vs_fp64(dtype, symmetric, scale):
    """Observer qparams from numpy's min/max of the data with the documented rule in float64."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 30)) * scale + scale / 3).astype(np.float32)
    obs = make(MinMaxObserver, dtype=dtype, symmetric=symmetric)
    for part in np.array_split(x, 4):
        obs.update(torch.from_numpy(part))
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    qmin, qmax = (0, 255) if dtype == torch.uint8 else (-128, 127)
    eps = float(np.finfo(np.float32).eps)
    if symmetric:
        s = float(max(np.float32(max(-lo, hi) / ((qmax - qmin) / 2.0)), np.float32(eps)))
        z = (qmin + qmax + 1) // 2
    else:
        s = float(max(np.float32((hi - lo) / float(qmax - qmin)), np.float32(eps)))
        z = int(np.clip(qmin - np.rint(lo / s), qmin, qmax))
    qp = obs.compute_qparams()
    assert (qp.scale, qp.zero_point, qp.qmin, qp.qmax) == (s, z, qmin, qmax)
    pc = make(PerChannelMinMaxObserver, dtype=dtype, symmetric=symmetric, axis=1)
    pc.update(torch.from_numpy(x))
    pq = pc.compute_qparams()
    for c in (0, 7, 29):
        one = choose_qparams(float(x[:, c].min()), float(x[:, c].max()), dtype, symmetric)
        assert (float(pq.scale[c]), int(pq.zero_point[c])) == (one.scale, one.zero_point)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", ["normal", "outliers", "relu", "uniform", "bimodal"])
def test_best_range_is_the_lower_error_of_both_searches(symmetric, kind):
    g = torch.Generator().manual_seed(7)
    z = torch.randn(100000, generator=g)
    x = {"normal": z, "outliers": torch.cat([z, torch.tensor([60.0, -45.0])]), "relu": torch.relu(z) ** 3,
         "uniform": torch.rand(100000, generator=g), "bimodal": torch.cat([z * 0.1 - 3.0, z[:5000] + 4.0])}[kind]
    best, hist, mse = (make(cls, symmetric=symmetric) for cls in (BestRangeObserver, HistogramObserver, MSEObserver))
    for obs in (best, hist, mse):
        obs.update(x)
    errors = {name: best.quantization_error(o.compute_qparams()) for name, o in (("hist", hist), ("mse", mse))}
    chosen = best.quantization_error(best.compute_qparams())
    assert chosen == min(errors.values())
    (glo, ghi, gerr), (mlo, mhi, merr) = best.candidate_ranges()
    assert (glo, ghi) == hist.chosen_range() and (mlo, mhi) == mse.chosen_range()
    assert (gerr, merr) == (errors["hist"], errors["mse"])
    assert best.chosen_range() == ((mlo, mhi) if merr < gerr else (glo, ghi))
