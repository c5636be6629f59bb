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
@given(n=st.integers(1, 3), c=st.integers(1, 140), h=st.integers(1, 13), w=st.integers(1, 13),
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


# ---- qbackend::global_avg_pool2d -----------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3), c=st.integers(1, 70), h=st.integers(1, 9), w=st.integers(1, 9),
       signed_in=st.booleans(), signed_out=st.booleans(), channels_last=st.booleans(),
       x_scale=st.floats(1e-3, 10.0), ratio=st.floats(0.05, 20.0), zps=st.tuples(st.integers(0, 255),
                                                                                 st.integers(0, 255)),
       seed=st.integers(0, 2**16))
def test_global_avg_pool_matches_fp64(n, c, h, w, signed_in, signed_out, channels_last, x_scale, ratio, zps, seed):
    """The int8 global average pool against the fp64 mean of the dequantized integers, quantized:
    equal but at rounding ties (the kernel multiplies the exact sum by one fp32 factor), never more
    than 1 level apart."""
    from qbackend.ops import reference as R
    x_dtype = torch.int8 if signed_in else torch.uint8
    y_dtype = torch.int8 if signed_out else torch.uint8
    x_zp = zps[0] - (128 if signed_in else 0)
    y_zp = zps[1] - (128 if signed_out else 0)
    x = _ints((n, c, h, w), x_dtype, seed)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out_scale = x_scale * ratio
    y = OPS.global_avg_pool2d(x, x_scale, x_zp, out_scale, y_zp, y_dtype)
    ref = R.global_avg_pool2d(x, x_scale, x_zp, out_scale, y_zp, y_dtype)
    assert y.shape == (n, c, 1, 1) and y.dtype == y_dtype
    assert n == 0 or int((y.int() - ref.int()).abs().max()) <= 1


def test_global_avg_pool_is_exact_away_from_ties():
    """Means that are whole levels (equal pixels) and a 7x7 map (sums never tie at a half level
    when H * W is odd) come out exactly."""
    from qbackend.ops import reference as R
    x = _ints((4, 1280, 7, 7), torch.uint8, 3).contiguous(memory_format=torch.channels_last)
    y = OPS.global_avg_pool2d(x, 0.05, 7, 0.05, 7, torch.uint8)
    assert torch.equal(y, R.global_avg_pool2d(x, 0.05, 7, 0.05, 7, torch.uint8))
    flat = torch.full((2, 16, 3, 3), 200, dtype=torch.uint8)
    assert torch.equal(OPS.global_avg_pool2d(flat, 0.1, 0, 0.1, 0, torch.uint8), torch.full((2, 16, 1, 1), 200,
                                                                                            dtype=torch.uint8))
    assert torch.equal(OPS.global_avg_pool2d(flat, 0.1, 0, 1.0, 0, torch.int8), torch.full((2, 16, 1, 1), 20,
                                                                                            dtype=torch.int8))


GAP_PATHS_CHILD = """
import sys, torch, qbackend
if {scalar}:
    qbackend._C.set_isa_cap(0)
inp = torch.load({inp!r})
out = [torch.ops.qbackend.global_avg_pool2d(x, 0.1, zp, 0.1, 0, torch.uint8 if x.dtype == torch.uint8 else torch.int8)
       for x, zp in inp]
torch.save({{"level": int(qbackend._C.usable_isa()), "out": out}}, {outp!r})
"""


def _outputs_on_both_paths(tmp_path, child: str, cases) -> dict:
    """`child` (a script template taking scalar, inp, outp) run on `cases` in a child process at the
    default ISA and in one capped to the baseline ISA (the scalar loops): {"default": its outputs,
    "scalar": its outputs}."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from subprocess_utils import run_py
    inp = str(tmp_path / "in.pt")
    torch.save(cases, inp)
    results = {}
    for name, scalar in (("default", False), ("scalar", True)):
        outp = str(tmp_path / f"{name}.pt")
        run_py(child.format(scalar=scalar, inp=inp, outp=outp), check=True)
        results[name] = torch.load(outp)
    assert results["scalar"]["level"] == 0
    return {name: res["out"] for name, res in results.items()}


def test_global_avg_pool_sums_exactly_on_every_path(tmp_path):
    """The channel sums on the AVX2 kernel (64 and 16 channels at a time, in int16 over chunks of 128
    pixels, then a tail channel at a time) and on the baseline loop: extreme images over several
    chunks (the int16 bound), random ones with every kind of channel block; each output equals the
    fp64 reference (odd pixel counts: no ties)."""
    from qbackend.ops import reference as R
    g = torch.Generator().manual_seed(5)
    cl = torch.channels_last
    cases = [(torch.full((1, 99, 21, 19), 255, dtype=torch.uint8).contiguous(memory_format=cl), 0),
             (torch.full((1, 80, 21, 19), -128, dtype=torch.int8).contiguous(memory_format=cl), 0),
             (torch.full((1, 80, 21, 19), 127, dtype=torch.int8).contiguous(memory_format=cl), 0),
             (torch.randint(0, 256, (2, 99, 17, 19), dtype=torch.uint8, generator=g).contiguous(memory_format=cl), 131),
             (torch.randint(-128, 128, (3, 1283, 7, 7), dtype=torch.int8, generator=g).contiguous(memory_format=cl), -3),
             (torch.randint(0, 256, (1, 5, 3, 3), dtype=torch.uint8, generator=g), 9)]
    for name, outs in _outputs_on_both_paths(tmp_path, GAP_PATHS_CHILD, cases).items():
        for (x, zp), y in zip(cases, outs):
            ref = R.global_avg_pool2d(x, 0.1, zp, 0.1, 0, x.dtype)
            assert torch.equal(y, ref), (name, x.shape, x.dtype)


MAX_PATHS_CHILD = """
import sys, torch, qbackend
if {scalar}:
    qbackend._C.set_isa_cap(0)
inp = torch.load({inp!r})
out = [torch.ops.qbackend.max_pool2d(x, [k, k], [s, s], [p, p], [d, d], ceil) for x, k, s, p, d, ceil in inp]
torch.save({{"level": int(qbackend._C.usable_isa()), "out": out}}, {outp!r})
"""


def test_max_pool_on_every_path(tmp_path):
    """Max pooling on the AVX2 kernel (128, 32 and 16 channels at a time, then one at a time; the
    window's rows and columns clipped to the image, dilated) and on the baseline loop: every kind of
    channel block, signed and unsigned, each output equal to torch's fp32 pooling of the integers."""
    cl = torch.channels_last
    cases = []
    for i, c in enumerate((1, 15, 16, 17, 31, 32, 48, 64, 100, 128, 129, 200, 257)):
        dtype = torch.int8 if i % 2 else torch.uint8
        x = _ints((2, c, 9 + i % 3, 11), dtype, i).contiguous(memory_format=cl)
        k, s, p, d = ((3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 1, 2), (5, 3, 2, 1))[i % 4]
        cases.append((x, k, s, p, d, i % 3 == 0))
    for name, outs in _outputs_on_both_paths(tmp_path, MAX_PATHS_CHILD, cases).items():
        for (x, k, s, p, d, ceil), y in zip(cases, outs):
            ref = torch.nn.functional.max_pool2d(x.float(), k, s, p, d, ceil_mode=ceil)
            assert not torch.isinf(ref).any()
            assert y.dtype == x.dtype and torch.equal(y.float(), ref), (name, x.shape, x.dtype, k, s, p, d, ceil)


def test_global_avg_pool_rounds_ties_to_even():
    """Means at exact half levels (two pixels with an odd sum) round to the even level, as round-half-even
    does, for both output types, and means beyond the output's range clamp."""
    sums = torch.arange(0, 64)  # pixel pairs (s // 2, s - s // 2): mean s / 2
    x = torch.stack([sums // 2, sums - sums // 2], dim=-1).to(torch.uint8).reshape(1, 64, 1, 2)
    y = OPS.global_avg_pool2d(x, 1.0, 0, 1.0, 0, torch.uint8)
    assert torch.equal(y.flatten(), torch.round(sums.double() / 2).to(torch.uint8))  # torch.round: half to even
    y8 = OPS.global_avg_pool2d(x, 1.0, 0, 1.0, -40, torch.int8)
    assert torch.equal(y8.flatten(), (torch.round(sums.double() / 2) - 40).to(torch.int8))
    big = torch.full((1, 16, 2, 2), 255, dtype=torch.uint8)
    assert torch.equal(OPS.global_avg_pool2d(big, 1.0, 0, 1e-4, 0, torch.uint8).flatten(), torch.full((16,), 255,
                                                                                                    dtype=torch.uint8))
    assert torch.equal(OPS.global_avg_pool2d(big, 1.0, 255, 1e-4, 100, torch.int8).flatten(),
                       torch.full((16,), 100, dtype=torch.int8))
    neg = torch.zeros((1, 16, 2, 2), dtype=torch.uint8)
    assert torch.equal(OPS.global_avg_pool2d(neg, 1.0, 255, 1e-4, 0, torch.int8).flatten(), torch.full((16,), -128,
                                                                                                     dtype=torch.int8))


@pytest.mark.parametrize("args,match", [
    ((torch.zeros(2, 3, 4, dtype=torch.uint8), 0.1, 0, 0.1, 0, torch.uint8), "x must be 4-D"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 0.1, 0, 0.1, 0, torch.float32), "output_dtype"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 0.0, 0, 0.1, 0, torch.uint8), "x_scale"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 0.1, 0, float("nan"), 0, torch.uint8), "output_scale"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 0.1, 256, 0.1, 0, torch.uint8), "x_zero_point"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.int8), 0.1, 200, 0.1, 0, torch.uint8), "x_zero_point"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 0.1, 0, 0.1, -1, torch.uint8), "output_zero_point"),
    ((torch.zeros(1, 0, 4, 4, dtype=torch.uint8), 0.1, 0, 0.1, 0, torch.uint8), "non-empty"),
    ((torch.zeros(1, 3, 0, 4, dtype=torch.uint8), 0.1, 0, 0.1, 0, torch.uint8), "non-empty"),
    ((torch.zeros(1, 1, 300, 300, dtype=torch.uint8), 0.1, 0, 0.1, 0, torch.uint8), "65536 pixels"),
    ((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), 1e30, 0, 1e-30, 0, torch.uint8), "must be finite"),
])
def test_global_avg_pool_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        OPS.global_avg_pool2d(*args)


def test_global_avg_pool_float_input_is_a_type_error():
    """As every int8 op's activation check (csrc/common/checks.h): a float x is a TypeError naming x."""
    with pytest.raises(TypeError, match="x must have dtype uint8 or int8"):
        OPS.global_avg_pool2d(torch.zeros(1, 3, 4, 4), 0.1, 0, 0.1, 0, torch.uint8)


def test_global_avg_pool_opcheck():
    x = _ints((2, 20, 5, 5), torch.uint8, 1).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(OPS.global_avg_pool2d.default, (x, 0.05, 3, 0.02, 10, torch.uint8))
