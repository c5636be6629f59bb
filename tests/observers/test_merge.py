"""Property tests of observer merge: calibration data split into batches (random sizes, some empty,
random order) and spread over observers that are merged in a random tree gives IDENTICAL state
(state_dict) and qparams as one pass over all the data, for MinMax, PerChannelMinMax and the
histogram observers (Histogram, Percentile, MSE); so does feeding the batches to one observer in
any order. Data: many orders of magnitude (subnormal to near FLT_MAX), positive-only,
negative-only, constant, all-zero, mixed magnitudes, ReLU-like, with or without NaN/inf.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qbackend.observers import (BestRangeObserver, HistogramObserver, MinMaxObserver, MSEObserver, ObserverError,
                                PercentileObserver, PerChannelMinMaxObserver)

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.observers.base.NonFiniteWarning")
HSET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F32_MAX = float(np.finfo(np.float32).max)
KINDS = ["normal", "positive", "negative", "offset", "constant", "zeros", "magnitudes", "relu"]


def make_data(kind: str, n: int, exp: int, seed: int, nonfinite: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = 2.0 ** exp
    z = rng.standard_normal(n)
    x = {
        "normal": z * scale,
        "positive": np.abs(z) * scale + 1e-45,
        "negative": -np.abs(z) * scale - 1e-45,
        "offset": (1000.0 + z) * scale,  # far from 0 relative to the spread: large bin numbers
        "constant": np.full(n, z[0] * scale),
        "zeros": np.where(rng.random(n) < 0.5, 0.0, -0.0),
        "magnitudes": np.sign(z) * 2.0 ** rng.uniform(-149, 127, n),
        "relu": np.maximum(z, 0.0) * scale,
    }[kind]
    x = np.clip(x, -F32_MAX, F32_MAX).astype(np.float32)
    if nonfinite and n:
        idx = rng.integers(0, n, max(1, n // 50))
        x[idx] = rng.choice(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), idx.size)
    return x


@st.composite
def calibration(draw, max_n: int = 2000):
    """(data, batches, merge_seed): float32 data and its split into batches (a random partition,
    cut at random points, some batches empty)."""
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(1, max_n))
    exp = draw(st.integers(-140, 120))
    seed = draw(st.integers(0, 2**32 - 1))
    x = make_data(kind, n, exp, seed, draw(st.booleans()))
    rng = np.random.default_rng(seed + 1)
    nb = draw(st.integers(1, 7))
    perm = rng.permutation(n) if draw(st.booleans()) else np.arange(n)
    cuts = np.sort(rng.integers(0, n + 1, nb - 1))
    parts = np.split(x[perm], cuts)
    return x, parts, seed


def state_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        va, vb = a[k], b[k]
        if isinstance(va, dict):
            if not (isinstance(vb, dict) and state_equal(va, vb)):
                return False
        elif isinstance(va, torch.Tensor):
            if not (isinstance(vb, torch.Tensor) and va.dtype == vb.dtype and torch.equal(va, vb)):
                return False
        elif type(va) is not type(vb) or va != vb:
            return False
    return True


def qparams_or_error(obs):
    try:
        return obs.compute_qparams()
    except ObserverError:
        return "no data"


def check_split_merge(make, full: torch.Tensor, parts: list[torch.Tensor], seed: int):
    one = make()
    one.update(full)
    rng = np.random.default_rng(seed)
    # one observer per batch, merged in a random tree
    pool = []
    for p in parts:
        o = make()
        o.update(p)
        pool.append(o)
    while len(pool) > 1:
        i, j = rng.choice(len(pool), 2, replace=False)
        pool[i].merge(pool[j])
        pool.pop(j)
    merged = pool[0]
    # one observer fed the batches in a random order
    seq = make()
    for i in rng.permutation(len(parts)):
        seq.update(parts[i])
    for other in (merged, seq):
        assert state_equal(one.state_dict(), other.state_dict()), (one.state_dict(), other.state_dict())
        assert qparams_or_error(one) == qparams_or_error(other)
    return one


@HSET
@given(c=calibration(), dtype=st.sampled_from([torch.uint8, torch.int8]), symmetric=st.booleans())
def test_minmax_merge_exact(c, dtype, symmetric):
    x, parts, seed = c
    one = check_split_merge(lambda: MinMaxObserver(dtype, symmetric, reduce_range=False),
                            torch.from_numpy(x), [torch.from_numpy(p) for p in parts], seed)
    fin = x[np.isfinite(x)]
    if fin.size:
        assert (one.min_val, one.max_val) == (float(fin.min()), float(fin.max()))


@HSET
@given(c=calibration(), bins=st.sampled_from([16, 17, 64, 2048]),
       cls=st.sampled_from([HistogramObserver, PercentileObserver, MSEObserver, BestRangeObserver]),
       symmetric=st.booleans())
def test_histogram_merge_exact(c, bins, cls, symmetric):
    x, parts, seed = c
    one = check_split_merge(lambda: cls(symmetric=symmetric, bins=bins, reduce_range=False),
                            torch.from_numpy(x), [torch.from_numpy(p) for p in parts], seed)
    fin = x[np.isfinite(x)].astype(np.float64)
    assert one.count == fin.size and int(one.counts.sum()) == fin.size
    if fin.size:
        edges = one.bin_edges().numpy()
        assert np.array_equal(one.counts.numpy(), np.histogram(fin, bins=edges)[0])


@HSET
@given(c=calibration(max_n=600), channels=st.integers(1, 5), axis_last=st.booleans(),
       symmetric=st.booleans())
def test_per_channel_merge_exact(c, channels, axis_last, symmetric):
    x, parts, seed = c

    def shaped(a):  # rows of `channels` values; channel axis last, or first (split along the other)
        a = a[: len(a) // channels * channels].reshape(-1, channels)
        return torch.from_numpy(np.ascontiguousarray(a if axis_last else a.T))

    axis = -1 if axis_last else 0
    full = torch.cat([shaped(p) for p in parts], dim=0 if axis_last else 1)
    one = check_split_merge(lambda: PerChannelMinMaxObserver(axis=axis, symmetric=symmetric),
                            full, [shaped(p) for p in parts], seed)
    if one.has_data:
        xt = full.movedim(axis, 0).reshape(channels, -1)
        for ch in range(channels):
            v = xt[ch][torch.isfinite(xt[ch])]
            if v.numel():
                assert (float(one.min_val[ch]), float(one.max_val[ch])) == (float(v.min()), float(v.max()))
