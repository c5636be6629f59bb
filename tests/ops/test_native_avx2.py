"""The native provider's AVX2 GEMM (csrc/kernels/gemm_avx2.cpp): int16 products (vpmaddwd), exact at
8 bits where vpmaddubsw's int16 pair sums would saturate (255 * 127 * 2 > 32767), held to fp64 math on
the same integers. Selected with `_C.set_native_kernel("avx2")` on any AVX2 CPU; under
QBACKEND_ISA=avx2 (CI's ISA rerun) it is also the provider's own choice, which the first test checks.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight, reference
from qbackend.ops.providers import PROVIDERS, exact_8bit_activations
from tests.ops.numerics import all_threads

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")]


@contextlib.contextmanager
def avx2_kernel():
    _C.set_native_kernel("avx2")
    try:
        assert _C.native_isa() == "avx2"
        yield
    finally:
        _C.set_native_kernel("")


def fp64_sums(x: torch.Tensor, x_zp: int, w: torch.Tensor) -> torch.Tensor:
    """sum_k (x - x_zp) * w[n, k] in fp64 (exact: every partial sum is an integer below 2**53)."""
    return (x.double() - x_zp) @ w.double().t()


def avx2_sums(x, x_zp, w, threads=False):
    """The kernel's int32 sums: unit scales, no bias, fp32 output (float(acc), rounded to nearest even)."""
    p = ops.native_linear_prepack(w)
    ones = torch.ones(w.shape[0])
    with avx2_kernel(), (all_threads() if threads else contextlib.nullcontext()):
        return ops.native_linear(x, 1.0, x_zp, p, ones, None, 1.0, 0, torch.float32, "none")


def assert_exact(y, x, zp, w, what=""):
    ref = fp64_sums(x, zp, w)
    assert torch.equal(y, ref.float()), f"{what}: max diff {float((y.double() - ref).abs().max())}"


def test_is_the_native_choice_without_vnni():
    if int(_C.usable_isa()) == 1 and not _C.avx_vnni_usable():  # AVX2 (or AVX512) without VNNI
        assert _C.native_isa() == "avx2"
        assert PROVIDERS["native"].exact_8bit() and exact_8bit_activations()
    else:
        assert _C.native_isa() != "avx2"


@pytest.mark.parametrize("k", [2, 64, 1000, 4096, 65536])
def test_saturating_worst_case_is_exact(k):
    """All activations 255 against weights of -128 (rows 0, 2) and 127 (rows 1, 3): every pair of
    products is 2 * 255 * 127 = 64770 or -65280, past int16, and K = 65536 reaches -255 * 128 * 2**16,
    just inside int32. Rows 2, 3 of x alternate 255 and 0; int8 x at 127 (uint8 255 after its shift)."""
    w = torch.full((20, k), -128, dtype=torch.int8)
    w[1::2] = 127
    x = torch.full((7, k), 255, dtype=torch.uint8)
    x[2, ::2] = 0
    x[3, 1::2] = 0
    y = avx2_sums(x, 0, w)
    assert_exact(y, x, 0, w, f"uint8 k={k}")
    if k == 65536:
        assert float(y[0, 0]) == 255 * -128 * k
    xi = torch.full((7, k), 127, dtype=torch.int8)
    assert_exact(avx2_sums(xi, -128, w), xi, -128, w, f"int8 k={k}")


@pytest.mark.parametrize("k", [1, 3, 4, 5, 17, 100, 257])
def test_every_tile_and_remainder_matches_fp64(k):
    """Rows 1..13 (tiles of 1-6 rows and remainders), columns 1..130 (a lone 8-column half, partial
    halves and vectors, several panels), K not a multiple of 4 or 16 (the widening's tail)."""
    g = torch.Generator().manual_seed(k)
    for n in (1, 7, 8, 9, 16, 17, 63, 64, 65, 130):
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
        w[0] = -128
        for m in (1, 2, 3, 4, 5, 6, 7, 12, 13):
            for dtype, zp in ((torch.uint8, 0), (torch.uint8, 131), (torch.int8, -128), (torch.int8, 7)):
                lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
                x = torch.randint(lo, hi, (m, k), dtype=dtype, generator=g)
                x[0] = hi - 1
                assert_exact(avx2_sums(x, zp, w), x, zp, w, f"m={m} n={n} k={k} {dtype} zp={zp}")


@pytest.mark.parametrize("m,n,k", [(400, 64, 300), (130, 700, 96), (100, 3072, 768)])
def test_thread_splits_match_fp64(m, n, k):
    """Rows split in multiples of the 6-row tile, or columns by panels: each thread widens its own rows."""
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    assert_exact(avx2_sums(x, 100, w, threads=True), x, 100, w)


def test_rows_with_a_stride_match_fp64():
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (70, 130), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (40, 300), dtype=torch.uint8, generator=g)[:, 10:140]
    assert not x.is_contiguous()
    assert_exact(avx2_sums(x, 5, w), x, 5, w)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("post", ["none", "relu", "gelu"])
def test_epilogue_matches_the_fp64_reference(post, out_dtype):
    """Scales, bias, post-op and requantization on the kernel's sums (the AVX-VNNI kernel's epilogue)
    against qbackend.ops.reference (fp64): fp32 within 1e-5 relative of the largest output (GELU's
    rational erf: 2e-7), uint8 within 1 LSB."""
    g = torch.Generator().manual_seed(7)
    m, n, k = 37, 70, 300
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    b = torch.randn(n, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    args = (x, 0.03, 9, ops.native_linear_prepack(w), ws, b, 0.4, 100, out_dtype, post)
    with avx2_kernel():
        got = ops.native_linear(*args)
    ref = reference.linear(x, 0.03, 9, w, ws, b, 0.4, 100, out_dtype, post)
    if out_dtype == torch.uint8:
        assert int((got.int() - ref.int()).abs().max()) <= 1
    else:
        assert float((got.double() - ref.double()).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("kernel,stride", [(3, 1), (3, 2), (1, 1)])
def test_dense_conv_matches_the_fp64_reference(kernel, stride):
    """KxK and 1x1 convs through the native GEMM (gathered taps) on full-range 8-bit activations."""
    g = torch.Generator().manual_seed(kernel * 10 + stride)
    oc, c = 40, 24
    w = torch.randint(-128, 128, (oc, c, kernel, kernel), dtype=torch.int8, generator=g)
    ws = torch.rand(oc, generator=g) * 0.01 + 1e-3
    b = torch.randn(oc, generator=g)
    pad = kernel // 2
    pw = PackedConv2dWeight(w, ws, b, (stride, stride), (pad, pad), (1, 1), 1, "native")
    x = torch.randint(0, 256, (2, c, 11, 11), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    x[:, :, :3] = 255
    with avx2_kernel():
        got = pw.conv2d(x, 0.02, 3, 1.0, 0, torch.float32)
    ref = reference.conv2d(x, 0.02, 3, w, ws, b, (stride, stride), (pad, pad), (1, 1), 1, 1.0, 0, torch.float32)
    assert float((got.double() - ref.double()).abs().max()) <= 1e-5 * float(ref.abs().max())
