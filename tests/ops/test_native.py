"""The native provider's own GEMM (csrc/kernels/gemm_*): exact int32 sums on every register-tile
shape, the thread splits, the 1x1 conv's strided and in-place paths, its packed-weight checks,
and its refusal where the CPU (or QBACKEND_ISA) lacks AVX512-VNNI.

The property tests against the fp64 reference (every output dtype, post-op, int8 inputs) run for
this provider in test_linear.py and test_conv2d.py, like the other providers'.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import qbackend  # noqa: F401
from qbackend._extension import _C
from qbackend.ops import PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import reference as R
from tests.ops.numerics import all_threads
from tests.subprocess_utils import run_py

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX512-VNNI")]


def exact_sums(x: torch.Tensor, x_zp: int, w: torch.Tensor) -> torch.Tensor:
    """sum_k (x - x_zp) * w[n, k] in int64: the independent reference."""
    return (x.to(torch.int64) - x_zp) @ w.to(torch.int64).t()


def native_sums(x, x_zp, w, threads=False):
    """The int32 sums through the kernel: unit scales, no bias, fp32 output (exact below 2**24)."""
    p = ops.native_linear_prepack(w)
    ones = torch.ones(w.shape[0])
    if threads:
        with all_threads():
            return ops.native_linear(x, 1.0, x_zp, p, ones, None, 1.0, 0, torch.float32, "none")
    return ops.native_linear(x, 1.0, x_zp, p, ones, None, 1.0, 0, torch.float32, "none")


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 255, 257])
def test_every_tile_shape_sums_exactly(k):
    """Rows 1..13 (every tile height 1..6 and the remainders), columns 1..200 (1-4 vectors per panel,
    partial vectors, several panels), K not a multiple of 4; extreme values at both ends."""
    g = torch.Generator().manual_seed(k)
    for n in (1, 15, 16, 17, 48, 63, 64, 65, 130, 200):
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
        w[0] = -128
        for m in list(range(1, 14)):
            for dtype, zp in ((torch.uint8, 0), (torch.uint8, 255), (torch.uint8, 131), (torch.int8, -128),
                              (torch.int8, 7)):
                lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
                x = torch.randint(lo, hi, (m, k), dtype=dtype, generator=g)
                x[0] = hi - 1
                y = native_sums(x, zp, w)
                ref = exact_sums(x, zp, w)
                assert torch.equal(y.to(torch.int64), ref), f"m={m} n={n} k={k} {dtype} zp={zp}"


def test_largest_sums_at_the_int32_range():
    """K = 65536 (the largest the provider takes) with x = 255 and w = -128 everywhere: the sum
    -255 * 128 * 2**16 is just inside int32. Every sum here is a multiple of 2**15 with at most 15
    significant bits, so the fp32 output holds it exactly."""
    k = 65536
    w = torch.full((3, k), -128, dtype=torch.int8)
    w[1] = 127
    w[2, ::2] = 1
    x = torch.full((2, k), 255, dtype=torch.uint8)
    x[1] = 0
    y = native_sums(x, 0, w)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 0, w))
    assert float(y[0, 0]) == 255 * -128 * k  # -2139095040, inside int32


def test_in_features_beyond_the_int32_bound_are_refused():
    with pytest.raises(ValueError, match="in_features <= 65536"):
        ops.native_linear_prepack(torch.zeros(4, 65537, dtype=torch.int8))


@pytest.mark.parametrize("m,n,k", [(1, 3072, 768), (3, 4096, 200), (400, 64, 300), (130, 700, 96), (2000, 40, 64)])
def test_thread_splits_sum_exactly(m, n, k):
    """Columns (few rows, or a weight larger than x) and rows (many rows) split over the threads;
    the weight in L2 (row blocks over every panel) and beyond it (a panel at a time)."""
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    assert torch.equal(native_sums(x, 100, w, threads=True).to(torch.int64), exact_sums(x, 100, w))


def test_rows_with_a_stride_are_read_in_place():
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (70, 40), dtype=torch.int8, generator=g)
    big = torch.randint(0, 256, (9, 100), dtype=torch.uint8, generator=g)
    x = big[:, 10:50]  # rows 100 bytes apart
    assert not x.is_contiguous()
    assert torch.equal(native_sums(x, 5, w).to(torch.int64), exact_sums(x, 5, w))
    xt = torch.randint(0, 256, (40, 9), dtype=torch.uint8, generator=g).t()  # column-major: copied
    assert torch.equal(native_sums(xt, 5, w).to(torch.int64), exact_sums(xt, 5, w))


@pytest.mark.parametrize("stride", [1, 2, 3, (2, 1), (1, 3)])
@pytest.mark.parametrize("n,c,hw,oc", [(1, 64, 9, 70), (4, 24, 14, 130), (2, 512, 7, 64), (1, 1024, 14, 300)])
def test_conv1x1_strided_and_in_place(stride, n, c, hw, oc):
    """The 1x1 conv: one GEMM over the pixels (stride 1; strided: over the pixels gathered first),
    with the residual fused, multi-threaded; native_conv2d_add_ writes the same bytes into accum."""
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    g = torch.Generator().manual_seed(sh * 100 + sw * 10 + c)
    w = torch.randint(-128, 128, (oc, c, 1, 1), dtype=torch.int8, generator=g)
    ws = torch.rand(oc, generator=g) * 0.01 + 1e-3
    b = torch.randn(oc, generator=g)
    x = torch.randint(0, 256, (n, c, hw, hw), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    oh, ow = (hw - 1) // sh + 1, (hw - 1) // sw + 1
    acc = torch.randint(-128, 128, (n, oc, oh, ow), dtype=torch.int8, generator=g).contiguous(
        memory_format=torch.channels_last)
    pw = PackedConv2dWeight(w, ws, b, (sh, sw), (0, 0), (1, 1), 1, "native")
    y64 = R.conv2d_fp64(x, 0.02, 131, w, ws, b, (sh, sw), (0, 0), (1, 1), 1, acc, 0.05, -3, "relu")
    out_scale = float(y64.abs().max()) / 100
    ref = R.quantize(y64, out_scale, 5, torch.int8)
    with all_threads():
        y = pw.conv2d(x, 0.02, 131, out_scale, 5, torch.int8, "relu", acc, 0.05, -3)
        donated = acc.clone()
        out = pw.conv2d_add_(x, 0.02, 131, out_scale, 5, torch.int8, "relu", donated, 0.05, -3)
    assert out is donated and torch.equal(donated, y)
    assert y.is_contiguous(memory_format=torch.channels_last)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01


def test_conv_geometries_it_does_not_run_are_refused():
    w = torch.zeros(8, 4, 3, 3, dtype=torch.int8)
    with pytest.raises(ValueError, match="1x1 convolutions with groups 1 and no padding"):
        PackedConv2dWeight(w, torch.ones(8), None, provider="native")
    with pytest.raises(ValueError, match="no padding"):
        PackedConv2dWeight(w[:, :, :1, :1], torch.ones(8), None, padding=(1, 1), provider="native")
    with pytest.raises(ValueError, match="groups 1"):
        PackedConv2dWeight(torch.zeros(8, 2, 1, 1, dtype=torch.int8), torch.ones(8), None, groups=2,
                           provider="native")


def test_packed_weight_is_checked():
    w = torch.randint(-128, 128, (20, 30), dtype=torch.int8)
    p = ops.native_linear_prepack(w)
    assert p.dtype == torch.uint8 and p.numel() == _C.native_packed_size(20, 30)
    x = torch.randint(0, 256, (2, 30), dtype=torch.uint8)
    s = torch.ones(20)
    bad = {
        "another provider's weight": ops.fbgemm_linear_prepack(w),
        "truncated": p[:-1].clone(),
        "header overwritten": torch.cat([torch.zeros(8, dtype=torch.uint8), p[8:]]),
        "not uint8": p.view(torch.int8),
        "not contiguous": torch.stack([p, p], 1)[:, 0],
    }
    for what, t in bad.items():
        with pytest.raises(ValueError, match="not a native packed weight"):
            ops.native_linear(x, 0.1, 0, t, s, None, 1.0, 0, torch.float32, "none")
    with pytest.raises(ValueError, match="in_features"):
        ops.native_linear(x[:, :29], 0.1, 0, p, s, None, 1.0, 0, torch.float32, "none")
    with pytest.raises(ValueError, match="w_scales"):
        ops.native_linear(x, 0.1, 0, p, torch.ones(19), None, 1.0, 0, torch.float32, "none")
    # A clone, a deepcopy or a torch.save round trip of the packed tensor is still a valid weight.
    y = ops.native_linear(x, 0.1, 3, p, s, None, 1.0, 0, torch.float32, "none")
    assert torch.equal(ops.native_linear(x, 0.1, 3, p.clone(), s, None, 1.0, 0, torch.float32, "none"), y)


def test_peak_loop_measures_something():
    assert _C.native_peak_ops(20000, 1) > 1e9


def test_refused_without_avx512_vnni():
    """Under QBACKEND_ISA=avx2 the ops raise a ValueError naming the ISA, the provider refuses every
    op, and a forced route falls back to the rules."""
    code = r'''
import json, torch, qbackend
from qbackend._extension import _C
from qbackend.ops.providers import PROVIDERS
from qbackend.dispatch.router import route
ops = torch.ops.qbackend
out = {"isa": _C.native_isa(), "refuses": PROVIDERS["native"].refuses("linear", {"m": 1, "k": 8, "n": 8})}
p = ops.native_linear_prepack(torch.ones(4, 8, dtype=torch.int8))
try:
    ops.native_linear(torch.zeros(1, 8, dtype=torch.uint8), 0.1, 0, p, torch.ones(4), None, 1.0, 0, torch.float32, "none")
    out["error"] = None
except ValueError as e:
    out["error"] = str(e)
out["route"] = route("linear", {"m": 1, "k": 8, "n": 8}, eight_bit_input=False, force="native").provider
print(json.dumps(out))
'''
    proc = run_py(code, env={"QBACKEND_ISA": "avx2"}, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isa"] == ""
    assert "AVX512-VNNI" in out["refuses"]
    assert out["error"] is not None and "AVX512-VNNI" in out["error"]
    assert out["route"] == "fbgemm"


def test_gelu_epilogue_over_its_whole_range():
    """The epilogue's rational erf (gemm_avx512_vnni.cpp) against the fp64 erf gelu, y from -12 to 12
    through the bias (the sums are 0): within 3.2e-7 * |y| (+ fp32 rounding of tiny values)."""
    n = 8192
    x = torch.tensor([[128, 3, 250, 7]], dtype=torch.uint8)
    w = torch.zeros(n, 4, dtype=torch.int8)
    w[:, 0] = 1  # (x - zp) = 0 on k = 0; the other k's weights are 0
    y = torch.linspace(-12, 12, n, dtype=torch.float64)
    y = torch.cat([y, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 5.65, -5.65, 5.66, -5.66, 100.0, -100.0],
                                   dtype=torch.float64)])
    n = y.numel()
    w = torch.cat([w, torch.zeros(n - w.shape[0], 4, dtype=torch.int8)])
    p = ops.native_linear_prepack(w)
    out = ops.native_linear(x, 1.0, 128, p, torch.ones(n), y.float(), 1.0, 0, torch.float32, "gelu")[0].double()
    b = y.float().double()
    exact = 0.5 * b * (1 + torch.erf(b / math.sqrt(2)))
    err = (out - exact).abs()
    assert float((err - 3.2e-7 * b.abs()).max()) <= 1e-12, float((err / b.abs().clamp_min(1e-30)).max())
    assert torch.isfinite(out).all()
