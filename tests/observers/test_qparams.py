"""Tests of qbackend.observers.qparams: choose_qparams against an independent fp64 computation
(numpy, written from the documented rule), the degenerate/symmetric/reduce_range cases, the
per-channel form, and bad arguments."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qbackend.observers import QParams, choose_qparams, default_reduce_range, qrange
from qbackend.observers.qparams import F32_EPS

HSET = settings(max_examples=80, deadline=None)


def expected(lo, hi, dtype, symmetric, qmin, qmax, eps=F32_EPS):
    """The documented rule in numpy float64 / float32."""
    lo, hi = np.float64(min(lo, 0.0)), np.float64(max(hi, 0.0))
    if symmetric:
        zp = (qmin + qmax + 1) // 2
        a = max(-lo, hi)
        if a == 0:
            return 1.0, zp
        return float(max(np.float32(a / ((qmax - qmin) / 2.0)), np.float32(eps))), zp
    if lo == hi:
        return 1.0, qmin
    s = float(max(np.float32((hi - lo) / np.float64(qmax - qmin)), np.float32(eps)))
    return s, int(np.clip(qmin - np.rint(lo / np.float64(s)), qmin, qmax))


finite32 = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                     st.floats(-10.0, 10.0, width=32), st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 3.4028235e38]))


@HSET
@given(a=finite32, b=finite32, dtype=st.sampled_from([torch.uint8, torch.int8]), symmetric=st.booleans(),
       reduce=st.booleans())
def test_choose_qparams_vs_fp64(a, b, dtype, symmetric, reduce):
    lo, hi = min(a, b), max(a, b)
    reduce = reduce and dtype == torch.uint8
    qmin, qmax = qrange(dtype, reduce)
    qp = choose_qparams(lo, hi, dtype, symmetric, reduce_range=reduce)
    s, zp = expected(lo, hi, dtype, symmetric, qmin, qmax)
    assert (qp.scale, qp.zero_point, qp.qmin, qp.qmax, qp.axis) == (s, zp, qmin, qmax, None)
    assert isinstance(qp.scale, float) and isinstance(qp.zero_point, int)
    assert qmin <= qp.zero_point <= qmax and qp.scale > 0 and math.isfinite(1.0 / qp.scale)
    assert np.float32(qp.scale) == qp.scale  # a float32 value
    # 0 is exactly representable; the range is covered to within half a step (and the eps guard)
    assert (0.0 / qp.scale) + qp.zero_point == qp.zero_point
    if not symmetric and qp.scale > F32_EPS:
        span = (qmax - qmin) * qp.scale
        assert span >= (max(hi, 0) - min(lo, 0)) * (1 - 1e-6)


@pytest.mark.parametrize("dtype,symmetric,want_zp", [(torch.uint8, False, 0), (torch.int8, False, -128),
                                                      (torch.uint8, True, 128), (torch.int8, True, 0)])
def test_degenerate_all_zero(dtype, symmetric, want_zp):
    qp = choose_qparams(0.0, 0.0, dtype, symmetric)
    assert qp.scale == 1.0 and qp.zero_point == want_zp


def test_symmetric_zero_points_and_ranges():
    assert choose_qparams(-1.0, 2.0, torch.uint8, True).zero_point == 128
    assert choose_qparams(-1.0, 2.0, torch.uint8, True, reduce_range=True).zero_point == 64
    assert choose_qparams(-1.0, 2.0, torch.int8, True).zero_point == 0
    qp = choose_qparams(-1.0, 2.0, torch.int8, True)
    assert qp.scale == float(np.float32(2.0 / 127.5))
    qp = choose_qparams(-4.0, 1.0, torch.uint8, False, reduce_range=True)  # 7-bit activations
    assert (qp.qmin, qp.qmax) == (0, 127) and qp.scale == float(np.float32(5.0 / 127))
    assert qp.zero_point == round(4.0 / qp.scale)
    # positive-only / negative-only data: the range is widened to include 0
    assert choose_qparams(2.0, 5.0, torch.uint8).zero_point == 0
    assert choose_qparams(-5.0, -2.0, torch.uint8).zero_point == 255
    assert choose_qparams(2.0, 5.0, torch.uint8).scale == float(np.float32(5.0 / 255))
    # eps guard (as torch.ao: float32 epsilon) and a custom eps
    assert choose_qparams(0.0, 1e-12, torch.uint8).scale == float(np.float32(F32_EPS))
    assert choose_qparams(0.0, 1e-12, torch.uint8, eps=1e-30).scale == float(np.float32(1e-12 / 255))


def test_per_channel_matches_per_tensor():
    g = torch.Generator().manual_seed(0)
    lo = -torch.rand(50, generator=g) * torch.logspace(-6, 6, 50)
    hi = torch.rand(50, generator=g) * torch.logspace(6, -6, 50)
    lo[3], hi[3] = 0.0, 0.0  # degenerate channel
    lo[7], hi[7] = 1.0, 2.0  # positive-only channel
    for dtype in (torch.uint8, torch.int8):
        for sym in (False, True):
            qp = choose_qparams(lo, hi, dtype, sym, axis=1)
            assert qp.per_channel and qp.axis == 1 and qp.scale.dtype == torch.float32
            assert qp.zero_point.dtype == torch.int32 and qp.scale.shape == (50,)
            for i in range(50):
                one = choose_qparams(float(lo[i]), float(hi[i]), dtype, sym)
                assert float(qp.scale[i]) == one.scale and int(qp.zero_point[i]) == one.zero_point, (i, sym)


def test_qparams_equality():
    a = choose_qparams(-1.0, 1.0, torch.uint8)
    assert a == choose_qparams(-1.0, 1.0, torch.uint8) and a != choose_qparams(-1.0, 1.1, torch.uint8)
    t = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 3.0])
    assert choose_qparams(*t, axis=0) == choose_qparams(*t, axis=0)
    assert choose_qparams(*t, axis=0) != choose_qparams(*t, axis=1) and a != "x"
    with pytest.raises(TypeError):
        hash(a)
    with pytest.raises(AttributeError):
        a.scale = 2.0  # frozen


def test_default_reduce_range_follows_the_exact_routes():
    """8 bits wherever the native GEMM runs (every AVX2 CPU: exact int16 products without VNNI)."""
    from qbackend.core.extension import _C

    exact = bool(_C.native_isa())
    assert default_reduce_range(torch.uint8) == (not exact)
    assert default_reduce_range(torch.int8) is False
    assert qrange(torch.uint8, None) == (0, 255 if exact else 127)
    assert qrange(torch.uint8, None, qmax=200) == (0, 200)  # explicit bounds win over the default


@pytest.mark.parametrize("kwargs,exc,text", [
    (dict(min_val=0.0, max_val=1.0, dtype=torch.float32), TypeError, "dtype must be torch.uint8 or torch.int8"),
    (dict(min_val=0.0, max_val=1.0, dtype=torch.quint8), TypeError, "dtype must"),
    (dict(min_val=1.0, max_val=0.0), ValueError, "min_val must be <= max_val"),
    (dict(min_val=float("nan"), max_val=1.0), ValueError, "finite"),
    (dict(min_val=0.0, max_val=float("inf")), ValueError, "finite"),
    (dict(min_val=0.0, max_val=1.0, dtype=torch.int8, reduce_range=True), ValueError, "reduce_range applies to uint8"),
    (dict(min_val=0.0, max_val=1.0, reduce_range=True, qmax=100), ValueError, "either reduce_range"),
    (dict(min_val=0.0, max_val=1.0, qmin=10, qmax=5), ValueError, "qmin < qmax"),
    (dict(min_val=0.0, max_val=1.0, qmax=300), ValueError, "qmax"),
    (dict(min_val=0.0, max_val=1.0, qmin=1.5), TypeError, "qmin must be an int"),
    (dict(min_val=0.0, max_val=1.0, reduce_range="yes"), TypeError, "reduce_range must"),
    (dict(min_val=0.0, max_val=1.0, symmetric=1), TypeError, "symmetric must"),
    (dict(min_val=0.0, max_val=1.0, eps=0.0), ValueError, "eps must"),
    (dict(min_val=0.0, max_val=1.0, eps=float("nan")), ValueError, "eps must"),
    (dict(min_val=0.0, max_val=1.0, axis=0), ValueError, "axis is only meaningful"),
    (dict(min_val=torch.zeros(2), max_val=torch.ones(3), axis=0), ValueError, "1-D of one length"),
    (dict(min_val=torch.zeros(2), max_val=torch.ones(2)), ValueError, "need an int axis"),
    (dict(min_val=torch.zeros(2), max_val=1.0, axis=0), TypeError, "both be tensors"),
    (dict(min_val=torch.ones(2), max_val=torch.zeros(2), axis=0), ValueError, "min_val must be <= max_val"),
    (dict(min_val=torch.tensor([0.0, float("nan")]), max_val=torch.ones(2), axis=0), ValueError, "finite"),
    (dict(min_val=-3e38, max_val=3e38, qmin=0, qmax=1), ValueError, "too wide"),
])
def test_bad_arguments(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        choose_qparams(**kwargs)


def test_qparams_record():
    qp = QParams(0.5, 3, torch.uint8, 0, 255)
    assert not qp.per_channel and qp.axis is None
