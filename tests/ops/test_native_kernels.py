"""The native provider's other kernels, selected with `_C.set_native_kernel`: the AMX kernel
(csrc/kernels/gemm_amx.cpp), the 256-bit AVX-VNNI kernel (gemm_avx2_vnni*.cpp) and the AVX2 kernel
without VNNI (gemm_avx2.cpp, int16 products; its own fp64 tests: test_native_avx2.py).

The CPU running the tests may have neither AMX nor AVX-VNNI, so each is run in a form this CPU
can execute:
  * amx_emulated: the AMX kernel is one template over two tile classes, the instructions and a
    C++ model of them that also raises where the hardware would fault (a tile used before its
    configuration, mismatched tile shapes). The emulated kernel runs the AMX kernel's blocking,
    tile configuration, remainders (K % 64 and M % 16 rows on VNNI) and epilogue. On an AMX
    machine the hardware kernel must also pass a self-check (the same problems against the VNNI
    kernel and exact sums) before the provider uses it; a failure there is a warning and the VNNI
    kernel, never a wrong result.
  * avx2_vnni where the CPU has AVX-VNNI, else avx2_vnni_evex: the same source compiled on the
    EVEX form of the same instruction (AVX512-VNNI + VL).
  * avx2: runs on every AVX2 CPU (under QBACKEND_ISA=avx2 the only one here: the AVX512 kernel the
    others are compared with is then the provider's choice, the avx2 kernel itself).
Each is held to the references of the AVX512 kernel (test_native.py): exact int32 sums against
int64, outputs byte-equal to the AVX512 kernel's for every epilogue (GELU within 2 ulp: the
256-bit kernel divides where the AVX512 one refines a reciprocal), and test_linear.py's property
test against the fp64 reference.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from tests.ops.numerics import HSET, all_threads
from tests.ops.test_linear import SLOW_HSET, linear_cases, run_linear_case
from tests.ops.test_native import beyond_l2_cases, exact_sums, native_sums

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")]


AVX2_VNNI = "avx2_vnni" if _C.avx_vnni_usable() else "avx2_vnni_evex"
# The emulated AMX kernel and the EVEX build need AVX512-VNNI (level 3); AVX-VNNI and AVX2 run below it.
KERNELS = [k for k in ["amx_emulated", AVX2_VNNI, "avx2"]
           if int(_C.usable_isa()) >= 3 or k == "avx2" or (k == "avx2_vnni" and _C.avx_vnni_usable())]


@contextlib.contextmanager
def native_kernel(name):
    _C.set_native_kernel(name)
    try:
        assert _C.native_isa() == name
        yield
    finally:
        _C.set_native_kernel("")


def emulated_amx():
    return native_kernel("amx_emulated")


@pytest.mark.parametrize("kernel", KERNELS)
def test_switch_selects_the_kernel_and_back(kernel):
    before = _C.native_isa()
    with native_kernel(kernel):
        pass
    assert _C.native_isa() == before


def test_a_kernel_the_cpu_cannot_run_is_refused():
    names = [] if int(_C.usable_isa()) >= 4 else ["amx"]
    names += [] if _C.avx_vnni_usable() else ["avx2_vnni"]
    for name in names + ["sse"]:
        with pytest.raises(ValueError, match="no native kernel"):
            _C.set_native_kernel(name)
    assert _C.native_isa() in ("amx", "avx512_vnni", "avx2_vnni", "avx2")


@pytest.mark.skipif(int(_C.usable_isa()) < 3, reason="the emulated AMX kernel needs AVX512-VNNI")
def test_self_check_passes_on_the_emulated_kernel():
    assert _C.native_amx_self_check(emulated=True) == ""


@pytest.mark.skipif(int(_C.usable_isa()) < 4, reason="no AMX on this CPU (or QBACKEND_ISA caps it)")
def test_self_check_passes_on_the_hardware_kernel():
    assert _C.native_amx_self_check(emulated=False) == ""
    assert _C.native_isa() == "amx"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("k", [1, 3, 5, 64, 65, 100, 128, 191, 256])
def test_every_block_and_remainder_sums_exactly(kernel, k):
    """Rows 1..13 (every register-tile height and remainder) and around the AMX kernel's 16- and
    32-row blocks (16..47: one or two tiles high and a VNNI remainder), columns 1..200 (1-4 vectors
    per panel, partial 8-column halves, several panels), K below 64 (VNNI only on AMX), a multiple
    of 64, or with a remainder; extremes at both ends."""
    g = torch.Generator().manual_seed(k)
    with native_kernel(kernel):
        for n in (1, 7, 9, 16, 17, 48, 64, 65, 130, 200):
            w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
            w[0] = -128
            for m in (1, 2, 3, 4, 5, 6, 7, 13, 16, 17, 31, 32, 33, 47, 48, 70):
                for dtype, zp in ((torch.uint8, 0), (torch.uint8, 131), (torch.int8, -128), (torch.int8, 7)):
                    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
                    x = torch.randint(lo, hi, (m, k), dtype=dtype, generator=g)
                    x[0] = hi - 1
                    x[-1] = lo
                    y = native_sums(x, zp, w)
                    assert torch.equal(y.to(torch.int64), exact_sums(x, zp, w)), f"m={m} n={n} k={k} {dtype} zp={zp}"


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "amx_emulated"])
@pytest.mark.parametrize("order", ["rows", "vectors"])
def test_weights_beyond_the_l2_budget_sum_exactly(kernel, order):
    """The 256-bit kernels' two tile orders of a weight beyond the L2 budget, with their prefetches:
    exact sums (tests/ops/test_native.py: beyond_l2_cases)."""
    g = torch.Generator().manual_seed(11)
    with native_kernel(kernel):
        for m, n, k in beyond_l2_cases(order):
            w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
            w[0] = -128
            x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
            x[0] = 255
            assert torch.equal(native_sums(x, 5, w).to(torch.int64), exact_sums(x, 5, w)), f"m={m} n={n} k={k}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_largest_sums_at_the_int32_range(kernel):
    """K = 65536: -255 * 128 * 2**16 is just inside int32 (and exact in fp32)."""
    k = 65536
    w = torch.full((17, k), -128, dtype=torch.int8)
    w[1] = 127
    x = torch.full((16, k), 255, dtype=torch.uint8)
    x[1] = 0
    with native_kernel(kernel):
        y = native_sums(x, 0, w)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 0, w))
    assert float(y[0, 0]) == 255 * -128 * k


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("m,n,k", [(48, 70, 192), (37, 33, 100), (5, 9, 30)])
def test_every_epilogue_matches_the_avx512_kernel(kernel, m, n, k, x_dtype):
    """Every output dtype, post-op and bias gives the AVX512 kernel's bytes (the AMX tiles take the
    sums of signed activations against zero point - 128, VNNI against + 128: the results must still
    agree exactly). GELU: the AMX kernel shares the AVX512 epilogue (bytes equal); the 256-bit one
    divides where the AVX512 one refines a reciprocal, so within 2 ulp (of the output dtype) + 4 fp32
    eps of the largest output, or 1 LSB."""
    g = torch.Generator().manual_seed(m * n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    lo, hi = (0, 256) if x_dtype == torch.uint8 else (-128, 128)
    x = torch.randint(lo, hi, (m, k), dtype=x_dtype, generator=g)
    zp = 9 if x_dtype == torch.uint8 else -5
    p = ops.native_linear_prepack(w)
    for bias in (None, torch.randn(n, generator=g)):
        for post in ("none", "relu", "gelu"):
            for out_dtype, out_zp in ((torch.float32, 0), (torch.bfloat16, 0), (torch.uint8, 100), (torch.int8, -3)):
                args = (x, 0.03, zp, p, ws, bias, 0.2, out_zp, out_dtype, post)
                ref = ops.native_linear(*args)
                with native_kernel(kernel):
                    got = ops.native_linear(*args)
                what = f"bias={bias is not None} post={post} out={out_dtype}"
                if post == "gelu" and kernel != "amx_emulated":
                    assert_close_ulps(got, ref, what)
                else:
                    assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float32 else got,
                                       ref.view(torch.uint8) if ref.dtype != torch.float32 else ref), what


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m,n,k", [(400, 64, 300), (130, 700, 96), (2000, 40, 64), (100, 3072, 768)])
def test_thread_splits_sum_exactly(kernel, m, n, k):
    """Rows split in multiples of the kernel's row tile (AMX: the 32-row block), or columns by
    panels; on AMX each thread configures its own tiles (the emulation raises on one that did not)."""
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    with native_kernel(kernel):
        y = native_sums(x, 100, w, threads=True)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 100, w))


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_with_a_stride_are_read_in_place(kernel):
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (70, 130), dtype=torch.int8, generator=g)
    big = torch.randint(0, 256, (40, 300), dtype=torch.uint8, generator=g)
    x = big[:, 10:140]  # rows 300 bytes apart: the A tiles load with that stride
    assert not x.is_contiguous()
    with native_kernel(kernel):
        y = native_sums(x, 5, w)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 5, w))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("stride", [1, 2])
def test_conv1x1_is_byte_equal_to_the_avx512_kernel(kernel, stride):
    """A 1x1 conv with a fused residual (the pixels as rows, the tiles reading them in place)."""
    g = torch.Generator().manual_seed(stride)
    oc, c = 130, 96
    w = torch.randint(-128, 128, (oc, c, 1, 1), dtype=torch.int8, generator=g)
    pw = PackedConv2dWeight(w, torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g),
                            (stride, stride), (0, 0), (1, 1), 1, "native")
    x = torch.randint(0, 256, (2, c, 14, 14), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    oh = (14 - 1) // stride + 1
    acc = torch.randint(-128, 128, (2, oc, oh, oh), dtype=torch.int8, generator=g).contiguous(
        memory_format=torch.channels_last)
    args = (x, 0.02, 131, 0.05, 5, torch.int8, "relu", acc, 0.05, -3)
    ref = pw.conv2d(*args)
    with native_kernel(kernel), all_threads():
        got = pw.conv2d(*args)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("kernel", KERNELS)
@HSET
@given(data=st.data())
def test_linear_matches_reference(kernel, data):
    """test_linear.py's property test (fp64 reference, 1-LSB rule; shapes up to 70 x 160 x 48,
    int8 and uint8 inputs, every output dtype and post-op) on the kernel."""
    case = data.draw(linear_cases("native"))
    with native_kernel(kernel):
        run_linear_case("native", case)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
@SLOW_HSET
@given(data=st.data())
def test_linear_matches_reference_sweep(kernel, data):
    case = data.draw(linear_cases("native"))
    with native_kernel(kernel):
        run_linear_case("native", case)


def assert_close_ulps(got, ref, what):
    if got.dtype in (torch.uint8, torch.int8):
        assert int((got.int() - ref.int()).abs().max()) <= 1, what
        return
    # erf's error scales with the pre-activation y, not with gelu(y) (tiny for negative y): 2 ulp of
    # the value (of its dtype) plus 4 fp32 eps of the largest output (about max |y|).
    ulp = torch.finfo(got.dtype).eps
    got, ref = got.double(), ref.double()
    tol = 2 * ulp * ref.abs() + 4 * torch.finfo(torch.float32).eps * float(ref.abs().max())
    assert bool(((got - ref).abs() <= tol).all()), what
