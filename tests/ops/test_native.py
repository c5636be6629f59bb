"""The native provider's own GEMM (csrc/kernels/gemm_*): exact int32 sums on every register-tile
shape, the thread splits, the 1x1 conv's strided and in-place paths, its packed-weight checks,
and its refusal where the CPU (or QBACKEND_ISA) lacks AVX512-VNNI.

The property tests against the fp64 reference (every output dtype, post-op, int8 inputs) run for
this provider in test_linear.py and test_conv2d.py, like the other providers'.
"""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from qbackend.ops import reference as R
from tests.ops.numerics import NATIVE_KERNELS, all_threads, use_native_kernel
from tests.subprocess_utils import run_py

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")]
# The native depthwise conv's kernels: this CPU's choice, and the AVX2 one (int16 products) where
# that is another.
@pytest.fixture(params=NATIVE_KERNELS, ids=lambda k: k or "cpu_choice")
def depthwise_kernel(request):
    yield from use_native_kernel(request)


DEPTHWISE_KERNEL = pytest.mark.usefixtures("depthwise_kernel")


def exact_sums(x: torch.Tensor, x_zp: int, w: torch.Tensor) -> torch.Tensor:
    """sum_k (x - x_zp) * w[n, k] in int64: the independent reference."""
    return (x.to(torch.int64) - x_zp) @ w.to(torch.int64).t()


def beyond_l2_cases(order: str):
    """(m, n, k) problems whose weight exceeds the sweep's L2 budget (K x N > 512 KiB: one panel at
    a time, the tiles prefetching what runs next) in the 256-bit kernels' two tile orders, sized from
    this CPU's L2 (gemm_avx2_vnni_impl.h): "rows", the panel and the rows inside 3/4 of the L2 (row
    tiles outer); "vectors", the panel and the rows over it where one 16-column vector and the rows
    fit (vectors outer). n = 130: a last panel of one partial vector; k odd: a partial k-group."""
    from qbackend.dispatch.cpu import cpu_features

    budget = (cpu_features().l2_bytes or 1 << 20) // 4 * 3
    if order == "rows":
        return [(m, 520, 1027) for m in (1, 6, 12, 25)]
    # for m rows, k (odd, its k-groups kp = k rounded up to 4) with the weight beyond 512 KiB
    # (130 kp > 512 KiB), the panel and the rows over the budget ((64 + m) kp) and one vector and the
    # rows inside it ((16 + m) kp): from an L2 of about 256 KiB up
    cases = []
    for m in (25, 31):
        k = max((512 << 10) // 130 + 1, budget // (64 + m) + 1) | 1
        kp = (k + 3) // 4 * 4
        if 130 * kp > 512 << 10 and (64 + m) * kp > budget and (16 + m) * kp <= budget:
            cases.append((m, 130, k))
    assert cases, f"no vectors-outer case fits an L2 budget of {budget} bytes"
    return cases


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


@pytest.mark.parametrize("n", [520, 590])
def test_weights_beyond_the_l2_budget_sum_exactly(n):
    """A weight over the kernel's L2 budget (K x N > 512 KiB) runs one panel at a time and has the
    tiles prefetch the next panel (one to three slices of it for 2-4 row tiles, none for one): the
    sums stay exact for every tile count and for a last panel of one or two partial vectors."""
    g = torch.Generator().manual_seed(n)
    k = 1027
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    for m in (1, 6, 7, 12, 13, 18, 19, 25):
        x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
        assert torch.equal(native_sums(x, 3, w).to(torch.int64), exact_sums(x, 3, w)), f"m={m} n={n}"


@pytest.mark.parametrize("m,n,k", [(1000, 64, 1024), (1003, 200, 255), (50, 300, 2048)])
def test_rows_read_ahead_changes_no_byte(m, n, k):
    """The VNNI kernel's read ahead of the next row tile's activations (on where the sweep reads rows
    from L3 or memory: the first panel over each block of rows, every panel beside a weight over the
    L2 budget) only prefetches: the sums stay exact and the requantized bytes are the same with it
    off, for several row blocks, partial tiles, a partial k-group and both thread splits."""
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    p = ops.native_linear_prepack(w)
    scales, bias = torch.rand(n, generator=g) * 1e-3 + 1e-4, torch.randn(n, generator=g)
    outs = {}
    try:
        for on in (True, False):
            _C.set_native_rows_read_ahead(on)
            for threads in (False, True):
                assert torch.equal(native_sums(x, 7, w, threads).to(torch.int64), exact_sums(x, 7, w)), \
                    f"read ahead {on}, threads {threads}"
                with all_threads() if threads else contextlib.nullcontext():
                    outs[on, threads] = ops.native_linear(x, 0.02, 7, p, scales, bias, 0.05, 128, torch.uint8, "relu")
    finally:
        _C.set_native_rows_read_ahead(True)
    for threads in (False, True):
        assert torch.equal(outs[True, threads], outs[False, threads])
    assert torch.equal(outs[True, False], outs[True, True])


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
@pytest.mark.parametrize("n,c,hw,oc", [(1, 64, 9, 70), (4, 24, 14, 130), (2, 512, 7, 64), (1, 1024, 14, 300),
                                       (8, 64, 28, 130)])
def test_conv1x1_strided_and_in_place(stride, n, c, hw, oc):
    """The 1x1 conv: one GEMM over the pixels (stride 1; strided: over the pixels gathered first),
    with the residual fused, multi-threaded; native_conv2d_add_ writes the same bytes into accum.
    8 x 28 x 28 pixels: a residual large enough that the 256-bit kernels read it ahead."""
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


def test_residual_read_ahead_with_vectors_outer():
    """One thread, a 1x1 conv whose panel and rows overflow the 256-bit kernels' L2 budget where one
    vector and the rows fit (vectors outer, gemm_avx2_vnni_impl.h) with a residual large enough to be
    read ahead: the same bytes as the fp64 reference (within 1 at ties) and in place."""
    from qbackend.dispatch.cpu import cpu_features

    budget = (cpu_features().l2_bytes or 1 << 20) // 4 * 3
    c, oc = 1024, 520  # a weight over 512 KiB: one panel at a time over all the rows
    pixels = budget // c - 32  # rows = budget - 32 K: over it with a 64-column panel, under it with 16
    g = torch.Generator().manual_seed(pixels)
    w = torch.randint(-64, 65, (oc, c, 1, 1), dtype=torch.int8, generator=g)
    ws, b = torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g)
    x = torch.randint(0, 256, (1, c, 1, pixels), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    acc = torch.randint(0, 256, (1, oc, 1, pixels), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    pw = PackedConv2dWeight(w, ws, b, (1, 1), (0, 0), (1, 1), 1, "native")
    y64 = R.conv2d_fp64(x, 0.02, 128, w, ws, b, (1, 1), (0, 0), (1, 1), 1, acc, 0.05, 120, "relu")
    out_scale = float(y64.abs().max()) / 200
    ref = R.quantize(y64, out_scale, 3, torch.uint8)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        y = pw.conv2d(x, 0.02, 128, out_scale, 3, torch.uint8, "relu", acc, 0.05, 120)
        donated = acc.clone()
        pw.conv2d_add_(x, 0.02, 128, out_scale, 3, torch.uint8, "relu", donated, 0.05, 120)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(donated, y)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01


@pytest.mark.parametrize("x_dtype,zp", [(torch.uint8, 0), (torch.uint8, 255), (torch.int8, -128), (torch.int8, 100)])
@pytest.mark.parametrize("geometry", [
    # (n, c, h, w, oc, kernel, stride, padding, dilation)
    (1, 64, 14, 14, 70, (3, 3), (1, 1), (1, 1), (1, 1)),    # gathered once, the GEMM split over threads
    (4, 32, 28, 28, 40, (3, 3), (1, 1), (1, 1), (1, 1)),    # per-thread ranges of gathered blocks
    (2, 16, 17, 15, 24, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 3, 40, 36, 16, (7, 7), (2, 2), (3, 3), (1, 1)),     # a stem: 3 channels, 147-byte rows
    (1, 8, 12, 13, 9, (3, 3), (1, 1), (2, 2), (2, 2)),      # dilated: the taps are not adjacent
    (2, 5, 9, 8, 7, (1, 5), (1, 2), (0, 2), (1, 1)),
    (1, 20, 6, 6, 33, (1, 1), (1, 1), (1, 1), (1, 1)),      # a padded 1x1: an all-padding border
    # stems: each kernel row one fixed-size copy inside the image, the general path at its borders
    (1, 3, 33, 35, 32, (3, 3), (2, 2), (1, 1), (1, 1)),     # MobileNetV2's, odd sizes
    (3, 3, 11, 12, 64, (7, 7), (2, 2), (3, 3), (1, 1)),     # ResNet's over several images
    (4, 3, 96, 96, 64, (7, 7), (2, 2), (3, 3), (1, 1)),     # per-thread blocks starting mid-row
    (1, 1, 9, 9, 16, (3, 3), (1, 1), (0, 0), (1, 1)),       # unpadded: copies near x's last byte
    (2, 4, 10, 10, 8, (3, 3), (1, 1), (0, 0), (2, 1)),      # dilated rows, adjacent taps
    (1, 3, 5, 40, 8, (5, 5), (1, 3), (2, 1), (1, 1)),
    (2, 6, 8, 8, 16, (3, 3), (1, 1), (1, 1), (1, 1)),       # 18-byte kernel rows: 32-byte copies
    (1, 21, 7, 9, 16, (1, 3), (1, 1), (0, 1), (1, 1)),      # 63-byte kernel rows: 64-byte copies
])
def test_kxk_conv_sums_exactly(geometry, x_dtype, zp):
    """Convs with groups 1 beyond unpadded 1x1 gather each output pixel's taps (the zero point's
    byte in the padding) into rows: with unit scales and fp32 output the result is the exact
    integer conv of (x - zp) and w (int64 reference), for zero points at both ends of the range."""
    n, c, h, w, oc, kernel, stride, padding, dilation = geometry
    g = torch.Generator().manual_seed(c * oc + h)
    wt = torch.randint(-128, 128, (oc, c, *kernel), dtype=torch.int8, generator=g)
    lo, hi = (0, 256) if x_dtype == torch.uint8 else (-128, 128)
    x = torch.randint(lo, hi, (n, c, h, w), dtype=x_dtype, generator=g).contiguous(memory_format=torch.channels_last)
    pw = PackedConv2dWeight(wt, torch.ones(oc), None, stride, padding, dilation, 1, "native")
    assert tuple(pw.packed.shape[:2]) == kernel  # the packed bytes carry the kernel size for the fake impl
    exact = torch.nn.functional.conv2d((x.to(torch.int64) - zp).double(), wt.double(), None, stride, padding,
                                       dilation).to(torch.int64)  # exact: |sums| < 2**53
    with all_threads():
        y = pw.conv2d(x, 1.0, zp, 1.0, 0, torch.float32, "none")
    assert torch.equal(y.to(torch.int64), exact)


def test_kxk_conv_residual_in_place():
    """A 3x3 conv with its residual fused (ResNet-18's second conv of a block), into accum in place."""
    g = torch.Generator().manual_seed(5)
    wt = torch.randint(-128, 128, (64, 64, 3, 3), dtype=torch.int8, generator=g)
    ws, b = torch.rand(64, generator=g) * 0.01 + 1e-3, torch.randn(64, generator=g)
    pw = PackedConv2dWeight(wt, ws, b, (1, 1), (1, 1), (1, 1), 1, "native")
    x = torch.randint(0, 256, (2, 64, 14, 14), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    acc = torch.randint(0, 256, (2, 64, 14, 14), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    y64 = R.conv2d_fp64(x, 0.02, 120, wt, ws, b, (1, 1), (1, 1), (1, 1), 1, acc, 0.05, 128, "relu")
    out_scale = float(y64.abs().max()) / 200
    ref = R.quantize(y64, out_scale, 0, torch.uint8)
    with all_threads():
        y = pw.conv2d(x, 0.02, 120, out_scale, 0, torch.uint8, "relu", acc, 0.05, 128)
        donated = acc.clone()
        pw.conv2d_add_(x, 0.02, 120, out_scale, 0, torch.uint8, "relu", donated, 0.05, 128)
    assert torch.equal(donated, y)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01


def test_conv_packed_weights_are_checked():
    """The [kH, kW, L] packed conv weight must match its header; a 1-D 1x1 weight (earlier versions'
    format) still runs; a conv weight is not a Linear weight. (A Linear weight given to a conv reads
    as such a 1x1 weight: its in_features are then checked against x's channels.)"""
    g = torch.Generator().manual_seed(6)
    wt = torch.randint(-128, 128, (8, 4, 3, 3), dtype=torch.int8, generator=g)
    p = ops.native_conv2d_prepack(wt, [1, 1], [1, 1], [1, 1], 1)
    x = torch.randint(0, 256, (1, 4, 5, 5), dtype=torch.uint8, generator=g)
    args = ([1, 1], [1, 1], [1, 1], 1, 1.0, 0, torch.float32, "none")
    y = ops.native_conv2d(x, 0.1, 3, p, torch.ones(8), None, *args)
    for bad in (p.reshape(-1), p.reshape(3, 3, -1)[:, :, :-1].contiguous(), p.reshape(1, 9, -1),
                p.view(3, 3, -1).transpose(0, 1)):
        with pytest.raises(ValueError, match="not a native packed"):
            ops.native_conv2d(x, 0.1, 3, bad, torch.ones(8), None, *args)
    with pytest.raises(ValueError, match="x has 4 channels but the weight expects 36"):
        ops.native_conv2d(x, 0.1, 3, ops.native_linear_prepack(wt.reshape(8, 36)), torch.ones(8), None, *args)
    with pytest.raises(ValueError, match="not a native packed"):
        ops.native_linear(x.reshape(1, -1)[:, :36], 0.1, 0, p, torch.ones(8), None, 1.0, 0, torch.float32, "none")
    assert torch.equal(ops.native_conv2d(x, 0.1, 3, p.clone(), torch.ones(8), None, *args), y)
    # A 1x1 weight packed the earlier way (1-D, kernel size 0 in the header) is still a conv weight.
    w1 = wt[:, :, :1, :1].contiguous()
    old = ops.native_linear_prepack(w1.reshape(8, 4))
    new = ops.native_conv2d_prepack(w1, [1, 1], [0, 0], [1, 1], 1)
    a1 = ([1, 1], [0, 0], [1, 1], 1, 1.0, 0, torch.float32, "none")
    assert torch.equal(ops.native_conv2d(x, 0.1, 3, old, torch.ones(8), None, *a1),
                       ops.native_conv2d(x, 0.1, 3, new, torch.ones(8), None, *a1))


@pytest.mark.parametrize("x_dtype,zp", [(torch.uint8, 0), (torch.uint8, 255), (torch.int8, -128), (torch.int8, 127)])
@pytest.mark.parametrize("geometry", [
    # (n, c, h, w, kernel, stride, padding, dilation)
    (1, 16, 10, 9, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 24, 14, 14, (3, 3), (2, 2), (1, 1), (1, 1)),     # stride 2 (MobileNetV2's downsampling)
    (1, 8, 7, 7, (5, 5), (1, 1), (2, 2), (1, 1)),
    (1, 17, 9, 11, (3, 3), (1, 1), (2, 2), (2, 2)),      # dilated; 17 channels: a partial vector
    (1, 70, 6, 6, (1, 3), (1, 2), (0, 1), (1, 1)),       # 70 channels: 4 + 1 vectors, a partial one
    (2, 96, 40, 40, (3, 3), (1, 1), (1, 1), (1, 1)),     # rows split over the threads, the row ring reused
    (1, 3, 5, 6, (3, 3), (3, 2), (0, 0), (1, 1)),        # unpadded, output pixels fewer than a block
    (1, 20, 6, 23, (3, 9), (1, 2), (1, 4), (1, 1)),      # 9 taps a row: groups of 4, 4 and 1
    (1, 33, 9, 17, (2, 7), (2, 3), (1, 3), (1, 2)),      # dilated groups (4 + 3 taps), stride 3, padding on both sides
    (1, 144, 30, 30, (3, 3), (2, 2), (1, 1), (1, 1)),    # rows split over the threads at stride 2
    # stride 1 without dilation: inside the image each group's lanes slide one column at a time
    (1, 32, 5, 12, (1, 7), (1, 1), (0, 3), (1, 1)),      # groups of 4 and 3 taps
    (1, 40, 6, 9, (3, 2), (1, 1), (0, 0), (1, 1)),       # 2 taps: the last columns built whole
    (2, 64, 8, 30, (5, 5), (1, 1), (2, 2), (1, 1)),      # 4 + 1 taps: the single tap not slid
    (1, 48, 3, 20, (3, 3), (1, 1), (0, 5), (1, 1)),      # wide padding: the slide starts late
    (1, 16, 4, 5, (3, 3), (1, 1), (1, 1), (1, 1)),       # 5 columns: a short slide
    # whole 64-channel blocks: their lanes interleave 4 input columns bytewise (the rest as above)
    (1, 64, 9, 17, (2, 7), (2, 3), (1, 3), (1, 2)),      # dilated groups of 4 + 3 taps, padding both sides
    (1, 136, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1)),      # two whole blocks and 8 channels slid
    # 3 taps at stride 2: neighbouring output columns share a byte pair (the 4th, zero-weighted byte
    # reads the next input column, or the padding pixel past the image)
    (1, 64, 9, 10, (3, 3), (2, 2), (0, 0), (1, 1)),      # unpadded: the last group's 4th byte past the image
    (1, 128, 7, 9, (3, 3), (2, 2), (2, 2), (1, 1)),      # wide padding on both sides
    # rows in chunks of at most 192 KiB of input, each channel block in turn keeping its ring across them
    (2, 136, 40, 40, (3, 3), (1, 1), (1, 1), (1, 1)),    # chunks of 36 rows: one ends mid-image
    (1, 200, 64, 64, (3, 3), (2, 2), (1, 1), (1, 1)),    # stride 2: chunks of 7 output rows
])
@DEPTHWISE_KERNEL
def test_depthwise_conv_sums_exactly(geometry, x_dtype, zp):
    """Depthwise convs (groups = channels) accumulate x * w in int32 over 4-tap groups (vpdpbusd) less
    the zero point's share: with unit scales and fp32 output the result is the exact integer conv
    (int64 reference)."""
    n, c, h, w, kernel, stride, padding, dilation = geometry
    g = torch.Generator().manual_seed(c * h + w)
    wt = torch.randint(-128, 128, (c, 1, *kernel), dtype=torch.int8, generator=g)
    wt[0, 0, 0, 0] = -128
    lo, hi = (0, 256) if x_dtype == torch.uint8 else (-128, 128)
    x = torch.randint(lo, hi, (n, c, h, w), dtype=x_dtype, generator=g).contiguous(memory_format=torch.channels_last)
    x[0, 0] = lo if zp > 0 else hi - 1  # products at the extremes
    pw = PackedConv2dWeight(wt, torch.ones(c), None, stride, padding, dilation, c, "native")
    assert tuple(pw.packed.shape[:2]) == kernel
    exact = torch.nn.functional.conv2d((x.to(torch.int64) - zp).double(), wt.double(), None, stride, padding,
                                       dilation, c).to(torch.int64)
    with all_threads():
        y = pw.conv2d(x, 1.0, zp, 1.0, 0, torch.float32, "none")
    assert torch.equal(y.to(torch.int64), exact)


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("geometry", [
    # (n, c, h, w, stride): output rows split over 2, 3 or 4 threads, each building its own tap rows
    (1, 960, 7, 7, 1),       # 7 rows: parts of 2 or 3 rows, each reading the rows around it
    (1, 328, 7, 7, 1),       # 5 whole blocks and 8 channels
    (1, 576, 14, 14, 2),     # stride 2
    (1, 384, 14, 14, 1),
    (1, 96, 40, 40, 1),
    (3, 200, 9, 9, 1),       # several images: parts crossing an image boundary
])
@DEPTHWISE_KERNEL
def test_depthwise_thread_splits_sum_exactly(geometry, threads):
    """The call's output rows split over 2-4 threads (each with its own ring of tap rows): every
    split gives the exact integer conv."""
    n, c, h, w, stride = geometry
    g = torch.Generator().manual_seed(c + h + threads)
    wt = torch.randint(-128, 128, (c, 1, 3, 3), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    pw = PackedConv2dWeight(wt, torch.ones(c), None, (stride, stride), (1, 1), (1, 1), c, "native")
    exact = torch.nn.functional.conv2d((x.to(torch.int64) - 7).double(), wt.double(), None, stride, 1, 1,
                                       c).to(torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = pw.conv2d(x, 1.0, 7, 1.0, 0, torch.float32, "none")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y.to(torch.int64), exact)


@pytest.mark.parametrize("out_dtype,post_op", [(torch.uint8, "relu"), (torch.int8, "none"), (torch.uint8, "none")])
@pytest.mark.parametrize("c,kernel,stride", [(40, 3, 1), (128, 3, 2), (200, 3, 1), (64, 5, 1), (72, 3, 1)])
@DEPTHWISE_KERNEL
def test_depthwise_conv_requantizes_like_the_reference(c, kernel, stride, out_dtype, post_op):
    """The requantizing epilogue without a residual (terms worked out once per call; 64-channel
    blocks packed to bytes together, the rest a vector at a time): within 1 LSB of the fp64
    reference, and rarely off at all (only where the reference lies at a rounding tie)."""
    g = torch.Generator().manual_seed(c + kernel)
    wt = torch.randint(-128, 128, (c, 1, kernel, kernel), dtype=torch.int8, generator=g)
    ws, b = torch.rand(c, generator=g) * 0.01 + 1e-3, torch.randn(c, generator=g) * 4
    pad = kernel // 2
    pw = PackedConv2dWeight(wt, ws, b, (stride, stride), (pad, pad), (1, 1), c, "native")
    x = torch.randint(0, 256, (2, c, 11, 13), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    y64 = R.conv2d_fp64(x, 0.02, 131, wt, ws, b, (stride, stride), (pad, pad), (1, 1), c, None, 1.0, 0, post_op)
    out_scale = float(y64.abs().max()) / 120
    zp = 9 if out_dtype == torch.uint8 else -7
    ref = R.quantize(y64, out_scale, zp, out_dtype)
    with all_threads():
        y = pw.conv2d(x, 0.02, 131, out_scale, zp, out_dtype, post_op)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01
    assert int(y.int().min()) < int(y.int().max())  # not a constant output


@pytest.mark.parametrize("c,out_dtype", [(40, torch.int8), (128, torch.int8), (192, torch.uint8)])
@DEPTHWISE_KERNEL
def test_depthwise_conv_epilogue_and_residual_in_place(c, out_dtype):
    """The requantizing epilogue with a residual, in place too; 128 and 192 channels take its
    64-column form (four vectors packed to bytes together)."""
    g = torch.Generator().manual_seed(9)
    wt = torch.randint(-128, 128, (c, 1, 3, 3), dtype=torch.int8, generator=g)
    ws, b = torch.rand(c, generator=g) * 0.01 + 1e-3, torch.randn(c, generator=g)
    pw = PackedConv2dWeight(wt, ws, b, (1, 1), (1, 1), (1, 1), c, "native")
    x = torch.randint(0, 256, (2, c, 9, 9), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    acc = torch.randint(-128, 128, (2, c, 9, 9), dtype=torch.int8, generator=g).contiguous(
        memory_format=torch.channels_last)
    y64 = R.conv2d_fp64(x, 0.02, 120, wt, ws, b, (1, 1), (1, 1), (1, 1), c, acc, 0.05, -3, "relu")
    out_scale = float(y64.abs().max()) / 100
    zp = 5 if out_dtype == torch.int8 else 3
    ref = R.quantize(y64, out_scale, zp, out_dtype)
    y = pw.conv2d(x, 0.02, 120, out_scale, zp, out_dtype, "relu", acc, 0.05, -3)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01
    if out_dtype == torch.int8:  # in place: the output takes accum's dtype
        donated = acc.clone()
        pw.conv2d_add_(x, 0.02, 120, out_scale, zp, out_dtype, "relu", donated, 0.05, -3)
        assert torch.equal(donated, y)


def test_conv_geometries_it_does_not_run_are_refused():
    with pytest.raises(ValueError, match="groups 1, or depthwise"):
        PackedConv2dWeight(torch.zeros(8, 2, 1, 1, dtype=torch.int8), torch.ones(8), None, groups=4,
                           provider="native")
    with pytest.raises(ValueError, match="groups 1, or depthwise"):  # a channel multiplier of 2
        PackedConv2dWeight(torch.zeros(8, 1, 3, 3, dtype=torch.int8), torch.ones(8), None, groups=4,
                           provider="native")
    dw = ops.native_conv2d_prepack(torch.zeros(8, 1, 3, 3, dtype=torch.int8), [1, 1], [1, 1], [1, 1], 8)
    x = torch.zeros(1, 8, 5, 5, dtype=torch.uint8)
    with pytest.raises(ValueError, match="groups must be 8"):
        ops.native_conv2d(x, 0.1, 0, dw, torch.ones(8), None, [1, 1], [1, 1], [1, 1], 1, 1.0, 0, torch.float32, "none")
    gemm = ops.native_conv2d_prepack(torch.zeros(8, 8, 3, 3, dtype=torch.int8), [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(ValueError, match="groups 1"):
        ops.native_conv2d(x, 0.1, 0, gemm, torch.ones(8), None, [1, 1], [1, 1], [1, 1], 8, 1.0, 0, torch.float32,
                          "none")
    for bad in (dw.reshape(-1), dw[:, :, :-1].contiguous(), dw.view(1, 9, -1)):
        with pytest.raises(ValueError, match="not a native packed"):
            ops.native_conv2d(x, 0.1, 0, bad, torch.ones(8), None, [1, 1], [1, 1], [1, 1], 8, 1.0, 0,
                              torch.float32, "none")
    with pytest.raises(ValueError, match="65536"):
        ops.native_conv2d_prepack(torch.zeros(8, 8192, 3, 3, dtype=torch.int8), [1, 1], [1, 1], [1, 1], 1)


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


def test_runs_exactly_without_vnni():
    """Under QBACKEND_ISA=avx2 the native GEMM is the AVX2 kernel: it runs Linear and dense convs on
    full-range 8-bit activations exactly (the observers keep 8 bits), a forced route keeps it, and
    its depthwise conv runs too (the AVX2 kernel)."""
    code = r'''
import json, torch, qbackend
from qbackend.core.extension import _C
from qbackend.ops.providers import PROVIDERS
from qbackend.dispatch import route
from qbackend.observers import default_reduce_range
ops = torch.ops.qbackend
native = PROVIDERS["native"]
dw = {"n": 1, "c_in": 8, "c_out": 8, "h": 8, "w": 8, "kernel": (3, 3), "stride": 1, "groups": 8}
out = {"isa": _C.native_isa(), "refuses": native.refuses("linear", {"m": 1, "k": 8, "n": 8}),
       "dw": native.refuses("conv2d", dw), "exact": native.exact_8bit(), "seven": default_reduce_range(torch.uint8),
       "route": route("linear", {"m": 1, "k": 8, "n": 8}, eight_bit_input=True, forced="native").provider}
lin = {"m": 32, "k": 768, "n": 768}
conv = dict(dw, c_in=16, c_out=32, groups=1)
out["routes"] = [route("linear", lin).provider, route("linear", lin, eight_bit_input=False).provider,
                 route("conv2d", conv).provider, route("conv2d", dict(dw, n=2)).provider]
try:
    route("conv2d", dict(conv, c_out=16, groups=4))
    out["grouped"] = None
except ValueError as e:
    out["grouped"] = str(e)
w = torch.randint(-128, 128, (5, 300), dtype=torch.int8)
x = torch.full((3, 300), 255, dtype=torch.uint8)
y = ops.native_linear(x, 1.0, 0, ops.native_linear_prepack(w), torch.ones(5), None, 1.0, 0, torch.float32, "none")
out["exact_sums"] = torch.equal(y, (x.double() @ w.double().t()).float())
print(json.dumps(out))
'''
    proc = run_py(code, env={"QBACKEND_ISA": "avx2"}, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isa"] == "avx2" and out["refuses"] is None and out["exact"] and not out["seven"]
    assert out["route"] == "native" and out["exact_sums"]
    assert out["dw"] is None
    # the native GEMM for 8-bit inputs and for 7-bit ones at M = 32 (FBGEMM's 7-bit route is within
    # X_7BIT there), depthwise convs the native AVX2 depthwise kernel; a grouped conv has no exact
    # route: a clear error.
    assert out["routes"] == ["native", "native", "native", "native"]
    assert "reduce_range=True" in out["grouped"]


def test_refused_without_avx2():
    """Below AVX2 (the cap set directly: QBACKEND_ISA has no lower level) the ops raise a ValueError
    naming the ISA, the provider refuses every op, and a forced route falls back to the rules."""
    code = r'''
import json, torch, qbackend
from qbackend.core.extension import _C
_C.set_isa_cap(0, False)
from qbackend.ops.providers import PROVIDERS
from qbackend.dispatch import route
ops = torch.ops.qbackend
out = {"isa": _C.native_isa(), "refuses": PROVIDERS["native"].refuses("linear", {"m": 1, "k": 8, "n": 8})}
p = ops.native_linear_prepack(torch.ones(4, 8, dtype=torch.int8))
try:
    ops.native_linear(torch.zeros(1, 8, dtype=torch.uint8), 0.1, 0, p, torch.ones(4), None, 1.0, 0, torch.float32, "none")
    out["error"] = None
except ValueError as e:
    out["error"] = str(e)
out["route"] = route("linear", {"m": 1, "k": 8, "n": 8}, eight_bit_input=False, forced="native").provider
print(json.dumps(out))
'''
    proc = run_py(code, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isa"] == ""
    assert "AVX2" in out["refuses"]
    assert out["error"] is not None and "AVX2" in out["error"]
    assert out["route"] in ("fbgemm", "onednn")


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
