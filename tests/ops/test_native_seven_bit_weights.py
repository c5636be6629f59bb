"""The native GEMM on 7-bit weights (every |w| <= 64): AVX2's pair-product kernel
(kernels/gemm_avx2_pairs.cpp), which the AVX2 kernel hands such weights to. Sums exact against an
int64 reference on every tile height, remainder and extreme value (uint8 255 against +-64, where a
pair reaches 32640); the kernel choice from the packed weight's header (8-bit weights never reach
the pair products, which would saturate on them); bit-identical to the int16 products on convs with
every epilogue. Runs on any AVX2 CPU (set_native_kernel("avx2") selects the AVX2 kernels on CPUs with
VNNI)."""
from __future__ import annotations

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from qbackend.ops import reference as R
from tests.ops.numerics import all_threads, use_native_kernel
from tests.ops.test_native import beyond_l2_cases

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")]


@pytest.fixture(params=["avx2"])
def avx2_kernel(request):
    """The AVX2 kernels (pair products on 7-bit weights) on any AVX2 CPU, until the test ends."""
    yield from use_native_kernel(request)


def _w7(shape, g) -> torch.Tensor:
    """Random 7-bit weights with both extremes present."""
    w = torch.randint(-64, 65, shape, dtype=torch.int8, generator=g)
    w.view(shape[0], -1)[0, 0] = 64
    w.view(shape[0], -1)[-1, -1] = -64
    return w


def _sums(x, zp, w):
    p = ops.native_linear_prepack(w)
    return ops.native_linear(x, 1.0, zp, p, torch.ones(w.shape[0]), None, 1.0, 0, torch.float32, "none")


def test_kernel_choice_follows_the_weights_bits(avx2_kernel):
    g = torch.Generator().manual_seed(0)
    w = _w7((24, 40), g)
    assert _C.native_kernel_for(ops.native_linear_prepack(w)) == "avx2_pairs"
    for v in (65, -65, 127, -128):  # one weight beyond 7 bits: the whole weight stays on int16 products
        w8 = w.clone()
        w8[5, 7] = v
        assert _C.native_kernel_for(ops.native_linear_prepack(w8)) == "avx2", v
    conv = PackedConv2dWeight(_w7((16, 8, 3, 3), g), torch.ones(16), None, (1, 1), (1, 1), (1, 1), 1, "native")
    assert _C.native_kernel_for(conv.packed) == "avx2_pairs"
    _C.set_native_kernel("avx2_int16")
    assert _C.native_kernel_for(ops.native_linear_prepack(w)) == "avx2"


@pytest.mark.parametrize("k", [1, 3, 4, 5, 67, 256, 259])
def test_every_tile_sums_exactly(avx2_kernel, k):
    """Rows 1..12 (tile heights 1..5 and their remainders; the full tile's assembly loop), columns
    over partial vectors and several panels, K with and without a partial k-group; uint8 and int8
    inputs at the extremes (255 against 64 and -64 in one pair: 32640, the largest pair sum)."""
    g = torch.Generator().manual_seed(k)
    for n in (1, 16, 17, 63, 130):
        w = _w7((n, k), g)
        if k >= 2:
            w[:, 0], w[:, 1] = 64, 64
            w[n // 2, 0], w[n // 2, 1] = -64, -64
        for m in range(1, 13):
            for dtype, zp in ((torch.uint8, 0), (torch.uint8, 255), (torch.uint8, 131), (torch.int8, -128),
                              (torch.int8, 7)):
                lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
                x = torch.randint(lo, hi, (m, k), dtype=dtype, generator=g)
                x[0] = hi - 1
                if m > 2:
                    x[2] = lo
                ref = (x.to(torch.int64) - zp) @ w.to(torch.int64).t()
                assert torch.equal(_sums(x, zp, w).to(torch.int64), ref), f"m={m} n={n} k={k} {dtype} zp={zp}"


@pytest.mark.parametrize("order", ["rows", "vectors"])
def test_weights_beyond_the_l2_budget_sum_exactly(avx2_kernel, order):
    """Both tile orders of a weight beyond the L2 budget, with their prefetches (the next panel's
    slices, the next vector): exact sums, a last panel of one partial vector, a partial k-group."""
    g = torch.Generator().manual_seed(7)
    for m, n, k in beyond_l2_cases(order):
        w = _w7((n, k), g)
        x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
        x[0] = 255
        ref = (x.to(torch.int64) - 3) @ w.to(torch.int64).t()
        assert torch.equal(_sums(x, 3, w).to(torch.int64), ref), f"m={m} n={n} k={k}"


@pytest.mark.parametrize("m,n,k", [(1, 3072, 768), (37, 200, 300), (300, 64, 576)])
def test_thread_splits_sum_exactly(avx2_kernel, m, n, k):
    g = torch.Generator().manual_seed(m + n)
    w = _w7((n, k), g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    p = ops.native_linear_prepack(w)
    with all_threads():
        y = ops.native_linear(x, 1.0, 3, p, torch.ones(n), None, 1.0, 0, torch.float32, "none")
    assert torch.equal(y.to(torch.int64), (x.to(torch.int64) - 3) @ w.to(torch.int64).t())


@pytest.mark.parametrize("geometry", [
    # (n, c, h, w, oc, kernel, stride, padding)
    (1, 64, 14, 14, 70, (3, 3), (1, 1), (1, 1)),
    (2, 16, 17, 15, 24, (3, 3), (2, 2), (1, 1)),
    (1, 3, 40, 36, 16, (7, 7), (2, 2), (3, 3)),
    (3, 96, 9, 9, 24, (1, 1), (1, 1), (0, 0)),
])
@pytest.mark.parametrize("out_dtype,post", [(torch.float32, "none"), (torch.uint8, "relu"), (torch.int8, "none")])
def test_conv_matches_the_int16_products_and_the_reference(geometry, out_dtype, post):
    """The same conv on the pair products and on the int16 products: identical outputs (both exact),
    within 1 LSB of the fp64 reference where requantized, exact sums in float."""
    n, c, h, w, oc, kernel, stride, padding = geometry
    g = torch.Generator().manual_seed(c * oc)
    wt = _w7((oc, c, *kernel), g)
    ws, b = torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g)
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    pw = PackedConv2dWeight(wt, ws, b, stride, padding, (1, 1), 1, "native")
    y64 = R.conv2d_fp64(x, 0.02, 77, wt, ws, b, stride, padding, (1, 1), 1, None, 1.0, 0, post)
    scale = float(y64.abs().max()) / 120 if out_dtype != torch.float32 else 1.0
    zp = 0 if out_dtype == torch.int8 or post == "relu" else 0
    outs = {}
    for kernel_name in ("avx2", "avx2_int16"):
        _C.set_native_kernel(kernel_name)
        try:
            with all_threads():
                outs[kernel_name] = pw.conv2d(x, 0.02, 77, scale, zp, out_dtype, post)
        finally:
            _C.set_native_kernel("")
    assert torch.equal(outs["avx2"], outs["avx2_int16"])
    if out_dtype == torch.float32:
        torch.testing.assert_close(outs["avx2"].double(), y64, rtol=1e-5, atol=1e-4)
    else:
        diff = (outs["avx2"].int() - R.quantize(y64, scale, zp, out_dtype).int()).abs()
        assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01
