"""The native provider's AMX kernel (csrc/kernels/gemm_amx.cpp), run over emulated tiles.

This CPU may have no AMX. The kernel is one template over two tile classes, the instructions
and a C++ model of them that also raises where the hardware would fault (a tile used before its
configuration, mismatched tile shapes). So the emulated kernel runs the AMX kernel's blocking,
tile configuration, remainders (K % 64 on VNNI, M % 16 rows on VNNI) and epilogue here, and
these tests hold it to the same references as the VNNI kernel: exact int32 sums against int64,
byte-equal outputs to the VNNI kernel for every epilogue, and the shared property tests of
test_linear.py. On an AMX machine the hardware kernel must also pass the self-check (the same
problems against the VNNI kernel and exact sums) before the provider uses it; a failure there
is a warning and the VNNI kernel, never a wrong result.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qbackend  # noqa: F401
from qbackend._extension import _C
from qbackend.ops import PackedConv2dWeight
from tests.ops.numerics import HSET, all_threads
from tests.ops.test_linear import SLOW_HSET, linear_cases, run_linear_case
from tests.ops.test_native import exact_sums, native_sums

ops = torch.ops.qbackend
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX512-VNNI")]


@contextlib.contextmanager
def emulated_amx():
    _C.set_native_amx_emulated(True)
    try:
        assert _C.native_isa() == "amx_emulated"
        yield
    finally:
        _C.set_native_amx_emulated(False)


def test_switch_selects_the_emulated_kernel_and_back():
    before = _C.native_isa()
    with emulated_amx():
        pass
    assert _C.native_isa() == before != "amx_emulated"


def test_self_check_passes_on_the_emulated_kernel():
    assert _C.native_amx_self_check(emulated=True) == ""


@pytest.mark.skipif(_C.usable_level() < 4, reason="no AMX on this CPU (or QBACKEND_ISA caps it)")
def test_self_check_passes_on_the_hardware_kernel():
    assert _C.native_amx_self_check(emulated=False) == ""
    assert _C.native_isa() == "amx"


@pytest.mark.parametrize("k", [64, 65, 100, 128, 191, 256])
def test_every_block_and_remainder_sums_exactly(k):
    """Rows around the 16- and 32-row blocks (1..15 rows: VNNI only; 16..47: one or two tiles high
    and a VNNI remainder), columns 1..200 (1-4 vectors per panel: blocks one and two tiles wide,
    several panels), K a multiple of 64 or with a remainder on VNNI; extremes at both ends."""
    g = torch.Generator().manual_seed(k)
    with emulated_amx():
        for n in (1, 16, 17, 48, 64, 65, 130, 200):
            w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
            w[0] = -128
            for m in (5, 16, 17, 31, 32, 33, 47, 48, 70):
                for dtype, zp in ((torch.uint8, 0), (torch.uint8, 131), (torch.int8, -128), (torch.int8, 7)):
                    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
                    x = torch.randint(lo, hi, (m, k), dtype=dtype, generator=g)
                    x[0] = hi - 1
                    x[-1] = lo
                    y = native_sums(x, zp, w)
                    assert torch.equal(y.to(torch.int64), exact_sums(x, zp, w)), f"m={m} n={n} k={k} {dtype} zp={zp}"


def test_largest_sums_at_the_int32_range():
    """K = 65536 on the tiles: -255 * 128 * 2**16 is just inside int32 (and exact in fp32)."""
    k = 65536
    w = torch.full((17, k), -128, dtype=torch.int8)
    w[1] = 127
    x = torch.full((16, k), 255, dtype=torch.uint8)
    x[1] = 0
    with emulated_amx():
        y = native_sums(x, 0, w)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 0, w))
    assert float(y[0, 0]) == 255 * -128 * k


@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("m,n,k", [(48, 70, 192), (37, 33, 100)])
def test_every_epilogue_is_byte_equal_to_the_vnni_kernel(m, n, k, x_dtype):
    """The tiles' sums feed the VNNI kernel's epilogue: every output dtype, post-op, bias and
    residual gives the VNNI kernel's bytes (the sums of signed activations are taken against
    zero point - 128 on the tiles, + 128 on VNNI: the results must still agree exactly)."""
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
                vnni = ops.native_linear(*args)
                with emulated_amx():
                    amx = ops.native_linear(*args)
                assert torch.equal(amx.view(torch.uint8) if amx.dtype != torch.float32 else amx,
                                   vnni.view(torch.uint8) if vnni.dtype != torch.float32 else vnni), \
                    f"bias={bias is not None} post={post} out={out_dtype}"


@pytest.mark.parametrize("m,n,k", [(400, 64, 300), (130, 700, 96), (2000, 40, 64), (100, 3072, 768)])
def test_thread_splits_sum_exactly(m, n, k):
    """Rows split in multiples of the 32-row block, or columns by panels; each thread configures
    its own tiles (the emulation raises on a thread that did not)."""
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    with emulated_amx():
        y = native_sums(x, 100, w, threads=True)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 100, w))


def test_rows_with_a_stride_are_read_in_place():
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (70, 130), dtype=torch.int8, generator=g)
    big = torch.randint(0, 256, (40, 300), dtype=torch.uint8, generator=g)
    x = big[:, 10:140]  # rows 300 bytes apart: the A tiles load with that stride
    assert not x.is_contiguous()
    with emulated_amx():
        y = native_sums(x, 5, w)
    assert torch.equal(y.to(torch.int64), exact_sums(x, 5, w))


@pytest.mark.parametrize("stride", [1, 2])
def test_conv1x1_is_byte_equal_to_the_vnni_kernel(stride):
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
    vnni = pw.conv2d(*args)
    with emulated_amx(), all_threads():
        amx = pw.conv2d(*args)
    assert torch.equal(amx, vnni)


@HSET
@given(data=st.data())
def test_linear_matches_reference(data):
    """test_linear.py's property test (fp64 reference, 1-LSB rule; shapes up to 70 x 160 x 48,
    int8 and uint8 inputs, every output dtype and post-op) on the emulated AMX kernel."""
    case = data.draw(linear_cases("native"))
    with emulated_amx():
        run_linear_case("native", case)


@pytest.mark.slow
@SLOW_HSET
@given(data=st.data())
def test_linear_matches_reference_sweep(data):
    case = data.draw(linear_cases("native"))
    with emulated_amx():
        run_linear_case("native", case)
