"""The native direct convolution (csrc/kernels/conv_amx.cpp, conv_avx512_vnni.cpp): convs of stride 1 or 2
over a multiple of 64 channels as a GEMM over the zero-point-padded input (split into phase planes at
stride 2), A tiles (AMX) or register-tile rows (AVX512-VNNI) read in place with the pixel stride.

Run on the AVX512-VNNI kernel, on the AMX kernel over emulated tiles (any AVX512-VNNI CPU) and, where
the CPU has AMX, on the hardware tiles. Held to:
  * exact int32 sums: fp32 output with unit scales against an fp64 convolution of the same
    integers (x less its zero point; the padding adds nothing);
  * the same output bytes as the gathered-taps GEMM on the AVX512-VNNI kernel (the direct route
    switched off) for every epilogue
    (uint8 / int8 / fp32 / bf16 output, relu, gelu, a fused residual, int8 and uint8 input);
  * every split of the work: bands of rows over threads, several images, the weight's panels over
    threads (one image, a large weight), partial column vectors, padding and dilation of any size,
    strides 1 and 2 in either direction, odd sizes.
The route itself is checked by the op's counter of direct convs.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from tests.ops.numerics import all_threads
from tests.ops.test_native_kernels import native_kernel

pytestmark = pytest.mark.skipif(int(_C.usable_isa()) < 3, reason="the direct convolutions need AVX512-VNNI")

KERNELS = ["avx512_vnni", "amx_emulated"] + (["amx"] if _C.native_amx_self_check(False) == "" else [])


def takes_direct(kernel, geometry) -> bool:
    """Whether `kernel`'s direct convolution takes this geometry: AVX512-VNNI's takes stride 1 only
    (and weights up to 512 KB, which every geometry here is)."""
    return kernel != "avx512_vnni" or geometry[-1] == (1, 1)


@contextlib.contextmanager
def direct_route(enabled: bool):
    """The native convs with the direct route switched on or off (off: the gathered-taps GEMM); on again after."""
    _C.set_native_direct_conv(enabled)
    try:
        yield
    finally:
        _C.set_native_direct_conv(True)


# (batch, C, OC, H, W, kernel, padding, dilation, stride): bands over threads (one image), several
# images, the panels split (one image, weight larger than the image), 5x5 kernels, dilation, no
# padding, padding larger than the kernel's reach, a partial column vector (OC 40), 128 channels;
# stride 2 on odd and even sizes, with dilation, split by panels, and strides (1, 2) / (2, 1); a padded
# 1x1 at stride 2 (one phase plane of four read).
GEOMETRIES = [
    (1, 64, 32, 16, 16, 3, 1, 1, (1, 1)),
    (3, 64, 48, 9, 7, 3, 1, 1, (1, 1)),
    (1, 64, 128, 9, 9, 3, 1, 1, (1, 1)),
    (2, 64, 40, 8, 10, 5, 2, 1, (1, 1)),
    (1, 64, 64, 12, 12, 3, 2, 2, (1, 1)),
    (1, 64, 16, 6, 6, 3, 0, 1, (1, 1)),
    (1, 128, 80, 7, 7, 3, 3, 1, (1, 1)),
    (1, 64, 64, 15, 14, 3, 1, 1, (2, 2)),
    (2, 64, 48, 9, 9, 3, 1, 1, (2, 2)),
    (1, 128, 64, 10, 11, 5, 2, 1, (2, 2)),
    (1, 64, 32, 13, 13, 3, 2, 2, (2, 2)),
    (1, 64, 128, 14, 14, 3, 1, 1, (2, 2)),
    (2, 64, 32, 9, 8, 3, 1, 1, (1, 2)),
    (1, 64, 32, 8, 9, 3, 0, 1, (2, 1)),
    (2, 64, 32, 9, 9, 1, 1, 1, (2, 2)),
]


def _conv_case(geometry, x_dtype, seed):
    n, c, oc, h, w, k, pad, dil, stride = geometry
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-128, 128, (oc, c, k, k), dtype=torch.int8, generator=g)
    weight[0, 0, 0, 0] = -128
    lo, hi = (-128, 128) if x_dtype == torch.int8 else (0, 256)
    x = torch.randint(lo, hi, (n, c, h, w), dtype=x_dtype, generator=g).contiguous(memory_format=torch.channels_last)
    x[0, 0, 0, 0] = lo
    return weight, x, g


def _packed(weight, scales, bias, pad, dil, stride=(1, 1)):
    return PackedConv2dWeight(weight, scales, bias, stride, (pad, pad), (dil, dil), 1, "native")


def _out_size(size, k, pad, dil, stride):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_sums_are_exact(kernel, geometry, x_dtype):
    n, c, oc, h, w, k, pad, dil, stride = geometry
    weight, x, _ = _conv_case(geometry, x_dtype, seed=oc + h)
    zp = 7 if x_dtype == torch.int8 else 131
    pw = _packed(weight, torch.ones(oc), None, pad, dil, stride)
    before = _C.native_direct_conv_calls()
    with native_kernel(kernel), all_threads():
        got = pw.conv2d(x, 1.0, zp, 1.0, 0, torch.float32, "none")
    assert _C.native_direct_conv_calls() == before + takes_direct(kernel, geometry), "the conv did not take its route"
    ref = torch.nn.functional.conv2d(x.double() - zp, weight.double(), padding=pad, dilation=dil, stride=stride)
    assert got.shape == ref.shape
    assert torch.equal(got.double(), ref), float((got.double() - ref).abs().max())


EPILOGUES = [  # (x dtype, output dtype, post-op, residual dtype or None)
    (torch.uint8, torch.uint8, "relu", None),
    (torch.uint8, torch.uint8, "none", torch.uint8),
    (torch.int8, torch.int8, "none", torch.int8),
    (torch.int8, torch.uint8, "relu", torch.int8),
    (torch.uint8, torch.float32, "none", None),
    (torch.uint8, torch.bfloat16, "relu", torch.uint8),
    (torch.uint8, torch.int8, "gelu", None),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("geometry", GEOMETRIES[:4] + GEOMETRIES[6:9] + GEOMETRIES[10:])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_bytes_equal_the_gathered_taps(kernel, geometry, epilogue):
    x_dtype, out_dtype, post, res_dtype = epilogue
    n, c, oc, h, w, k, pad, dil, stride = geometry
    weight, x, g = _conv_case(geometry, x_dtype, seed=k + oc)
    pw = _packed(weight, torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g), pad, dil, stride)
    oh, ow = _out_size(h, k, pad, dil, stride[0]), _out_size(w, k, pad, dil, stride[1])
    zp = -5 if x_dtype == torch.int8 else 120
    integer_out = out_dtype in (torch.uint8, torch.int8)
    args = [x, 0.02, zp, 0.05 if integer_out else 1.0, 3 if out_dtype == torch.uint8 else 0, out_dtype, post]
    if res_dtype is not None:
        lo, hi = (-128, 128) if res_dtype == torch.int8 else (0, 256)
        acc = torch.randint(lo, hi, (n, oc, oh, ow), dtype=res_dtype, generator=g).contiguous(
            memory_format=torch.channels_last)
        args += [acc, 0.04, 2]
    with native_kernel("avx512_vnni"), all_threads(), direct_route(False):
        ref = pw.conv2d(*args)
    before = _C.native_direct_conv_calls()
    with native_kernel(kernel), all_threads():
        got = pw.conv2d(*args)
    assert _C.native_direct_conv_calls() == before + takes_direct(kernel, geometry), "the conv did not take its route"
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got, ref), float((got.float() - ref.float()).abs().max())


@pytest.mark.parametrize("kernel", KERNELS)
def test_residual_written_in_place(kernel):
    """conv2d_add_ (the residual conv writing into accum) on the direct route."""
    geometry = (2, 64, 64, 10, 10, 3, 1, 1, (1, 1))
    weight, x, g = _conv_case(geometry, torch.uint8, seed=3)
    pw = _packed(weight, torch.rand(64, generator=g) * 0.01 + 1e-3, torch.randn(64, generator=g), 1, 1)
    acc = torch.randint(0, 256, (2, 64, 10, 10), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    with native_kernel("avx512_vnni"), direct_route(False):
        ref = pw.conv2d(x, 0.02, 128, 0.05, 4, torch.uint8, "relu", acc, 0.03, 6)
    out = acc.clone()
    before = _C.native_direct_conv_calls()
    with native_kernel(kernel):
        torch.ops.qbackend.native_conv2d_add_(x, 0.02, 128, pw.packed, pw.w_scales, pw.bias, [1, 1], [1, 1], [1, 1], 1,
                                               0.05, 4, torch.uint8, "relu", out, 0.03, 6)
    assert _C.native_direct_conv_calls() == before + 1
    assert torch.equal(out, ref)


@pytest.mark.parametrize("kernel", KERNELS)
def test_switched_off_and_unsuited_convs_take_the_gathered_taps(kernel):
    """Stride 3, channels not a multiple of 64, and the switch off: no direct conv, same bytes."""
    g = torch.Generator().manual_seed(9)
    cases = [((1, 64, 32, 9, 9), (3, 3), True), ((1, 48, 32, 9, 9), (1, 1), True), ((1, 64, 32, 9, 9), (1, 1), False)]
    for (n, c, oc, h, w), stride, switch in cases:
        weight = torch.randint(-128, 128, (oc, c, 3, 3), dtype=torch.int8, generator=g)
        pw = PackedConv2dWeight(weight, torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g),
                                stride, (1, 1), (1, 1), 1, "native")
        x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g).contiguous(
            memory_format=torch.channels_last)
        with native_kernel("avx512_vnni"), direct_route(False):
            ref = pw.conv2d(x, 0.02, 128, 0.05, 4, torch.uint8, "relu")
        before = _C.native_direct_conv_calls()
        with native_kernel(kernel), direct_route(switch):
            got = pw.conv2d(x, 0.02, 128, 0.05, 4, torch.uint8, "relu")
        assert _C.native_direct_conv_calls() == before
        assert torch.equal(got, ref)


def test_vnni_limits_take_the_gathered_taps():
    """AVX512-VNNI's direct convolution takes stride 1 and weights up to 512 KB only: a 3x3 over 256
    channels to 256 (576 KB) and a stride-2 conv run on the gathered taps, the same bytes."""
    g = torch.Generator().manual_seed(11)
    for c, oc, stride in ((256, 256, (1, 1)), (64, 32, (2, 2))):
        weight = torch.randint(-128, 128, (oc, c, 3, 3), dtype=torch.int8, generator=g)
        pw = PackedConv2dWeight(weight, torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g),
                                stride, (1, 1), (1, 1), 1, "native")
        x = torch.randint(0, 256, (1, c, 6, 7), dtype=torch.uint8, generator=g).contiguous(
            memory_format=torch.channels_last)
        with native_kernel("avx512_vnni"), direct_route(False):
            ref = pw.conv2d(x, 0.02, 128, 0.05, 4, torch.uint8, "relu")
        before = _C.native_direct_conv_calls()
        with native_kernel("avx512_vnni"):
            got = pw.conv2d(x, 0.02, 128, 0.05, 4, torch.uint8, "relu")
        assert _C.native_direct_conv_calls() == before
        assert torch.equal(got, ref)


def test_dispatch_row_matches_the_vnni_direct_route():
    """The AVX512-VNNI dispatch row that sends KxK convs to the native provider at any size restates the
    kernel's direct-conv limits (GemmKernels::direct_conv_stride1, direct_conv_max_weight): at a batch
    past the gathered taps' 2M output values, a conv routes native exactly where the kernel takes the
    direct route."""
    from qbackend.dispatch import rules

    g = torch.Generator().manual_seed(12)
    # (C, OC, kernel, stride): 64 and 128 channels at stride 1, a 5x5 (400 KB), a 576 KB weight, stride 2
    for c, oc, k, s in ((64, 64, 3, 1), (128, 128, 3, 1), (64, 128, 5, 1), (256, 256, 3, 1), (64, 128, 3, 2)):
        weight = torch.randint(-128, 128, (oc, c, k, k), dtype=torch.int8, generator=g)
        pw = PackedConv2dWeight(weight, torch.ones(oc), None, (s, s), (k // 2, k // 2), (1, 1), 1, "native")
        x = torch.randint(0, 256, (1, c, 8, 8), dtype=torch.uint8, generator=g).contiguous(
            memory_format=torch.channels_last)
        before = _C.native_direct_conv_calls()
        with native_kernel("avx512_vnni"):
            pw.conv2d(x, 1.0, 0, 1.0, 0, torch.float32, "none")
        direct = _C.native_direct_conv_calls() == before + 1
        shape = {"n": 256, "c_in": c, "c_out": oc, "h": 56, "w": 56, "kernel": (k, k), "stride": s, "groups": 1}
        assert (rules.choose("conv2d", "avx512_vnni", shape).provider == "native") == direct, (c, oc, k, s, direct)
