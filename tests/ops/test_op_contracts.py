"""The int8 ops' input contracts where a provider once gave a wrong answer: each case is exact
against the fp64 reference or a clear ValueError, never a wrong value.

* Reductions past 65536 u8 x s8 products (int32 accumulation): every provider's prepack refuses
  them, and so do the routing records: `qbackend.quantize` of nn.Linear(70000, 4) raises (naming
  in_features) and quantize_dynamic keeps it in FP32, instead of returning -62.4 for 70.0.
* max_pool2d with a window larger than the (padded) input: aten's output size (floor division), an
  error where the output would be empty, in eager mode and in the fake impl alike.
* FBGEMM's requantization at tiny output scales (large multipliers): saturated, as the reference.
* The in-place residual conv (`*_conv2d_add_`) with accum sharing memory with x: refused.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import reference as R

from .numerics import exact_8bit

ops = torch.ops.qbackend


@pytest.mark.parametrize("provider", ["fbgemm", "onednn", "native"])
@pytest.mark.parametrize("k", [70000, 200000])
def test_long_reductions_are_refused(provider, k):
    if provider == "native" and not _C.native_isa():
        pytest.skip("no native GEMM on this ISA")
    w = torch.full((4, k), 127, dtype=torch.int8)
    with pytest.raises(ValueError, match="65536"):
        PackedLinearWeight(w, torch.full((4,), 1e-3 / 127), None, provider)
    wc = torch.ones(4, k // 9 + 1, 3, 3, dtype=torch.int8)
    if provider != "native":
        with pytest.raises(ValueError, match="65536"):
            PackedConv2dWeight(wc, torch.full((4,), 1e-3), None, (1, 1), (1, 1), (1, 1), 1, provider)


def test_long_reduction_through_the_public_api_is_an_error_not_a_wrong_answer():
    model = nn.Linear(70000, 4).eval()
    with torch.no_grad():
        model.weight.fill_(1e-3)
        model.bias.zero_()
    x = torch.ones(2, 70000)
    assert abs(float(model(x)[0, 0]) - 70.0) < 0.1
    with pytest.raises(ValueError, match="in_features > 65536"):
        qbackend.quantize(model, (x,), [x])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = qbackend.quantize_dynamic(model)  # the layer no provider runs exactly stays in FP32
    assert abs(float(dynamic(x)[0, 0]) - 70.0) < 0.1


def test_reduction_of_65536_is_exact():
    k = 65536
    w = torch.full((4, k), 127, dtype=torch.int8)
    x = torch.full((2, k), 255 if exact_8bit("fbgemm") else 127, dtype=torch.uint8)
    ws = torch.full((4,), 1e-3)
    ref = R.linear_fp64(x, 0.01, 0, w, ws, None)
    for provider in ("fbgemm", "onednn"):
        y = PackedLinearWeight(w, ws, None, provider).linear(x, 0.01, 0, 1.0, 0, torch.float32)
        torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=0)


POOL_CASES = [((1, 1), 2, 2, 0, False), ((2, 2), 3, 2, 0, False), ((5, 5), 6, 4, 0, False), ((5, 5), 6, 4, 1, True),
              ((3, 4), 4, 3, 1, False), ((7, 7), 3, 2, 1, True), ((6, 6), 2, 2, 0, True), ((4, 4), 5, 1, 2, False),
              ((1, 1), 1, 3, 0, True)]


@pytest.mark.parametrize("hw,k,s,p,ceil", POOL_CASES)
def test_max_pool2d_output_size_is_atens(hw, k, s, p, ceil):
    x = torch.randint(0, 256, (1, 4, *hw), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    try:
        ref = torch.nn.functional.max_pool2d(x.float(), k, s, p, 1, ceil)
    except RuntimeError:
        ref = None
    if ref is not None and ref.numel() == 0:
        ref = None
    if ref is None:
        with pytest.raises(ValueError, match="output would be empty|cover only padding"):
            ops.max_pool2d(x, [k, k], [s, s], [p, p], [1, 1], ceil)
        with pytest.raises(ValueError):
            with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
                ops.max_pool2d(mode.from_tensor(x), [k, k], [s, s], [p, p], [1, 1], ceil)
        return
    y = ops.max_pool2d(x, [k, k], [s, s], [p, p], [1, 1], ceil)
    assert torch.equal(y.float(), ref)


@pytest.mark.parametrize("out_scale", [1e-12, 1e-10, 1e-8, 1e-4, 1.0])
def test_fbgemm_requantization_saturates_at_tiny_output_scales(out_scale):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 128, (8, 64), dtype=torch.uint8, generator=g)
    w = torch.randint(-127, 128, (16, 64), dtype=torch.int8, generator=g)
    ws = torch.rand(16, generator=g) * 0.01 + 1e-3
    b = torch.randn(16, generator=g)
    for out_dtype in (torch.uint8, torch.int8):
        zp = 3 if out_dtype == torch.uint8 else -2
        ref = R.quantize(R.linear_fp64(x, 0.02, 60, w, ws, b), out_scale, zp, out_dtype)
        y = PackedLinearWeight(w, ws, b, "fbgemm").linear(x, 0.02, 60, out_scale, zp, out_dtype)
        assert (y.int() - ref.int()).abs().max() <= 1, (out_dtype, int((y != ref).sum()))
    xc = torch.randint(0, 128, (2, 8, 8, 8), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    wc = torch.randint(-127, 128, (8, 8, 3, 3), dtype=torch.int8, generator=g)
    cs = torch.rand(8, generator=g) * 0.01 + 1e-3
    ref = R.quantize(R.conv2d_fp64(xc, 0.02, 60, wc, cs, None, (1, 1), (1, 1), (1, 1), 1), out_scale, 5, torch.uint8)
    y = PackedConv2dWeight(wc, cs, None, (1, 1), (1, 1), (1, 1), 1, "fbgemm").conv2d(xc, 0.02, 60, out_scale, 5,
                                                                                   torch.uint8)
    assert (y.int() - ref.int()).abs().max() <= 1


@pytest.mark.parametrize("provider", ["native", "onednn"])
def test_in_place_residual_conv_refuses_accum_aliasing_x(provider):
    if provider == "native" and not _C.native_isa():
        pytest.skip("no native GEMM on this ISA")
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 128, (1, 16, 8, 8), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randint(-127, 128, (16, 16, 1, 1), dtype=torch.int8, generator=g)
    pw = PackedConv2dWeight(w, torch.full((16,), 1e-2), None, (1, 1), (0, 0), (1, 1), 1, provider)
    with pytest.raises(ValueError, match="shares memory with x"):
        pw.conv2d_add_(x, 0.02, 60, 0.5, 5, torch.uint8, "none", x, 0.02, 60)
    with pytest.raises(ValueError, match="shares memory with x"):
        pw.conv2d_add_(x, 0.02, 60, 0.5, 5, torch.uint8, "none", x[:, :, :, :], 0.02, 60)
    acc = x.clone()
    ref = R.quantize(R.conv2d_fp64(x, 0.02, 60, w, torch.full((16,), 1e-2), None, (1, 1), (0, 0), (1, 1), 1,
                                   acc, 0.02, 60), 0.5, 5, torch.uint8)
    pw.conv2d_add_(x, 0.02, 60, 0.5, 5, torch.uint8, "none", acc, 0.02, 60)
    assert (acc.int() - ref.int()).abs().max() <= 1
