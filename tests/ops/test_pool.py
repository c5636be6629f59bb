"""qbackend::max_pool2d on uint8/int8 against torch's fp32 max_pool2d on the same integers (exact:
max commutes with the monotonic dequantize), its bad-input errors, and its fake impl (opcheck)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qbackend.ops  # noqa: F401  (registers the ops and their fake impls)

OPS = torch.ops.qbackend


def _ints(shape, dtype, seed):
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    return torch.randint(lo, hi, shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 70), h=st.integers(1, 13), w=st.integers(1, 13),
       k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2), ceil=st.booleans(),
       channels_last=st.booleans(), signed=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_fp32_max_pool(n, c, h, w, k, s, d, ceil, channels_last, signed, seed):
    p = k // 2
    if h + 2 * p < d * (k - 1) + 1 or w + 2 * p < d * (k - 1) + 1:
        return  # the window does not fit: both raise
    x = _ints((n, c, h, w), torch.int8 if signed else torch.uint8, seed)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = torch.nn.functional.max_pool2d(x.float(), k, s, p, d, ceil_mode=ceil)
    if torch.isinf(ref).any():  # a window over padding only: no integer answer
        with pytest.raises(ValueError, match="only padding"):
            OPS.max_pool2d(x, [k, k], [s, s], [p, p], [d, d], ceil)
        return
    y = OPS.max_pool2d(x, [k, k], [s, s], [p, p], [d, d], ceil)
    assert y.dtype == x.dtype and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y.float(), ref)


def test_rectangular_and_default_stride():
    x = _ints((2, 5, 9, 11), torch.uint8, 1)
    y = OPS.max_pool2d(x, [3, 2])
    assert torch.equal(y.float(), torch.nn.functional.max_pool2d(x.float(), (3, 2)))
    y = OPS.max_pool2d(x, [3, 2], [2, 1], [1, 0])
    assert torch.equal(y.float(), torch.nn.functional.max_pool2d(x.float(), (3, 2), (2, 1), (1, 0)))


@pytest.mark.parametrize("x, args, match", [
    (torch.zeros(1, 2, 4, 4), ([2],), "uint8 or int8"),
    (torch.zeros(2, 4, 4, dtype=torch.uint8), ([2],), "4-D"),
    (torch.zeros(1, 2, 4, 4, dtype=torch.uint8), ([0],), "positive"),
    (torch.zeros(1, 2, 4, 4, dtype=torch.uint8), ([2], [2], [2]), "half the kernel"),
    (torch.zeros(1, 2, 2, 2, dtype=torch.uint8), ([5], [1], [0]), "empty"),
])
def test_bad_input(x, args, match):
    with pytest.raises(ValueError, match=match):
        OPS.max_pool2d(x, *args)


def test_opcheck():
    x = _ints((2, 8, 7, 7), torch.uint8, 3).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(OPS.max_pool2d.default, (x, [3, 3], [2, 2], [1, 1], [1, 1], True))
