"""The native conv weight with a padded GEMM K (native_gemm.h: Kg): a KxK conv over 1-15 channels packed
where the AMX kernel runs gets zero weight columns up to a multiple of 64, so its tiles cover every k.

Held to: the packed header records the padding (and only where the rule says: not for 1x1, 16+
channels, K already a multiple of 64, or padding beyond 2.5 K); exact int32 sums against an fp64
convolution on the AMX kernel (emulated tiles on any AVX512-VNNI CPU, the hardware where present)
and on the AVX512-VNNI kernel reading the same padded weight; the fake impl's shape equals the real
one; a header whose padding is smaller than K is refused by name.
"""
from __future__ import annotations

import io

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from tests.ops.numerics import all_threads
from tests.ops.test_native_kernels import native_kernel

pytestmark = pytest.mark.skipif(int(_C.usable_isa()) < 3, reason="the AMX kernel (or its emulation) needs AVX512-VNNI")

TILE_KERNELS = ["amx_emulated"] + (["amx"] if _C.native_amx_self_check(False) == "" else [])


def _header_kg(packed: torch.Tensor) -> int:
    return int(packed.reshape(-1)[40:48].view(torch.int64)[0])


@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_the_rule_pads_stems_only(kernel):
    with native_kernel(kernel):
        assert _C.native_conv_gemm_k(3, 7, 7) == 192
        assert _C.native_conv_gemm_k(3, 3, 3) == 64
        assert _C.native_conv_gemm_k(1, 3, 3) == 9     # 64 would be 7x the work
        assert _C.native_conv_gemm_k(16, 3, 3) == 144  # 16 channels and up: as they are
        assert _C.native_conv_gemm_k(3, 1, 1) == 3
        assert _C.native_conv_gemm_k(4, 4, 4) == 64
    with native_kernel("avx512_vnni"):
        assert _C.native_conv_gemm_k(3, 7, 7) == 147  # no tiles: no padding


@pytest.mark.parametrize("kernel", TILE_KERNELS)
@pytest.mark.parametrize("case", [(1, 3, 64, 23, 7, 2, 3), (2, 3, 32, 17, 3, 2, 1), (1, 2, 48, 12, 5, 1, 2)])
@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_sums_are_exact_on_every_kernel(kernel, case, x_dtype):
    n, c, oc, h, k, stride, pad = case
    g = torch.Generator().manual_seed(oc + k)
    weight = torch.randint(-128, 128, (oc, c, k, k), dtype=torch.int8, generator=g)
    weight[0, 0, 0, 0] = -128
    lo, hi = (-128, 128) if x_dtype == torch.int8 else (0, 256)
    x = torch.randint(lo, hi, (n, c, h, h), dtype=x_dtype, generator=g).contiguous(memory_format=torch.channels_last)
    zp = 5 if x_dtype == torch.int8 else 140
    with native_kernel(kernel):
        pw = PackedConv2dWeight(weight, torch.ones(oc), None, (stride, stride), (pad, pad), (1, 1), 1, "native")
    assert _header_kg(pw.packed) == (c * k * k + 63) // 64 * 64, "the stem's weight was not padded"
    ref = torch.nn.functional.conv2d(x.double() - zp, weight.double(), stride=stride, padding=pad)
    for run_on in (kernel, "avx512_vnni"):
        with native_kernel(run_on), all_threads():
            got = pw.conv2d(x, 1.0, zp, 1.0, 0, torch.float32, "none")
        assert torch.equal(got.double(), ref), (run_on, float((got.double() - ref).abs().max()))


@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_fake_shape_and_a_saved_weight(kernel):
    weight = torch.randint(-128, 128, (64, 3, 7, 7), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    with native_kernel(kernel):
        packed = torch.ops.qbackend.native_conv2d_prepack(weight, [2, 2], [3, 3], [1, 1], 1)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fake = torch.ops.qbackend.native_conv2d_prepack(mode.from_tensor(weight), [2, 2], [3, 3], [1, 1], 1)
    assert tuple(fake.shape) == tuple(packed.shape)
    assert _header_kg(packed) == 192
    buf = io.BytesIO()
    torch.save(packed, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert torch.equal(loaded, packed)
    x = torch.randint(0, 256, (1, 3, 20, 20), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    args = (0.02, 100, loaded, torch.full((64,), 0.01), None, [2, 2], [3, 3], [1, 1], 1, 0.05, 3, torch.uint8, "relu")
    with native_kernel("avx512_vnni"):
        a = torch.ops.qbackend.native_conv2d(x, *args)
    with native_kernel(kernel):
        b = torch.ops.qbackend.native_conv2d(x, *args)
    assert torch.equal(a, b)


@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_a_header_padding_below_k_is_refused(kernel):
    weight = torch.randint(-128, 128, (16, 3, 3, 3), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    with native_kernel(kernel):
        packed = torch.ops.qbackend.native_conv2d_prepack(weight, [1, 1], [1, 1], [1, 1], 1)
    bad = packed.clone()
    bad.reshape(-1)[40:48].view(torch.int64)[0] = 20  # K is 27
    x = torch.zeros(1, 3, 8, 8, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="w_packed"):
        torch.ops.qbackend.native_conv2d(x, 0.02, 0, bad, torch.full((16,), 0.01), None, [1, 1], [1, 1], [1, 1], 1,
                                         0.05, 3, torch.uint8, "relu")
