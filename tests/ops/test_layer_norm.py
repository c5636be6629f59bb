"""qbackend::layer_norm_quantize (csrc/ops/layer_norm_ops.cpp, kernels/layer_norm_avx512.cpp)
against an fp64 reference: y = layer_norm(x + residual) within fp32 rounding, q = the per-channel
quantize of y within one level (exactly the level of the kernel's own y), every combination of
residual / weight / bias, channel counts that leave vector tails, 7-bit qmax, and the argument
checks. Also run with QBACKEND_ISA=avx2 in CI (the ATen fallback)."""
from __future__ import annotations

import pytest
import torch

import qbackend  # noqa: F401

ops = torch.ops.qbackend


def reference(x, r, w, b, eps):
    s = x.double() + (r.double() if r is not None else 0)
    mean = s.mean(-1, keepdim=True)
    var = (s - mean).pow(2).mean(-1, keepdim=True)
    y = (s - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


def quantize(y, scales, zp, lo, hi):
    return torch.clamp(torch.round(y.double() / scales.double()) + zp, lo, hi)


@pytest.mark.parametrize("rows,c", [(1, 1), (5, 7), (3, 16), (130, 33), (17, 768)])
@pytest.mark.parametrize("residual,affine", [(False, False), (True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_matches_fp64(rows, c, residual, affine, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + c)
    x = torch.randn(rows, c, generator=g) * 3 + 1
    r = torch.randn(rows, c, generator=g) if residual else None
    w = torch.rand(c, generator=g) + 0.5 if affine else None
    b = torch.randn(c, generator=g) if affine else None
    scales = (torch.rand(c, generator=g) + 0.5) * 0.02
    lo, hi = (0, 255) if dtype == torch.uint8 else (-128, 127)
    zp = 128 if dtype == torch.uint8 else 0
    y, q = ops.layer_norm_quantize(x, r, w, b, 1e-5, scales, zp, dtype, hi)
    ref = reference(x, r, w, b, 1e-5)
    assert y.dtype == torch.float32 and q.dtype == dtype and y.shape == q.shape == x.shape
    if c > 1:
        assert float((y.double() - ref).abs().max()) <= 2e-5 * max(1.0, float(ref.abs().max()))
        # aten's fp32 LayerNorm on the same sum agrees to fp32 rounding too
        s = x + r if r is not None else x
        torch.testing.assert_close(y, torch.nn.functional.layer_norm(s, (c,), w, b, 1e-5), rtol=1e-5, atol=1e-5)
    # the int8 output is exactly the per-channel quantize of the kernel's own y, within 1 of the fp64 one
    assert torch.equal(q.double(), quantize(y, scales, zp, lo, hi))
    assert float((q.double() - quantize(ref, scales, zp, lo, hi)).abs().max()) <= 1


@pytest.mark.parametrize("rshape", [(1, 6, 40), (6, 40), (40,), (1, 1, 40)])
def test_residual_broadcast_over_leading_dims(rshape):
    """BERT's position embeddings [1, S, C] added to the token sum [B, S, C]: the residual's rows
    repeat over the batch, as torch broadcasts them."""
    g = torch.Generator().manual_seed(len(rshape))
    x = torch.randn(3, 6, 40, generator=g) * 2
    r = torch.randn(rshape, generator=g)
    scales = torch.full((40,), 0.02)
    y, q = ops.layer_norm_quantize(x, r, None, None, 1e-5, scales, 128, torch.uint8, 255)
    ref = reference(x, r.expand_as(x), None, None, 1e-5)
    assert float((y.double() - ref).abs().max()) <= 2e-5 * max(1.0, float(ref.abs().max()))
    y_full, q_full = ops.layer_norm_quantize(x, r.expand_as(x).contiguous(), None, None, 1e-5, scales, 128,
                                             torch.uint8, 255)
    assert torch.equal(y, y_full) and torch.equal(q, q_full)


def test_seven_bit_qmax_and_leading_dims():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 40, generator=g) * 5
    scales = torch.full((40,), 0.01)
    y, q = ops.layer_norm_quantize(x, None, None, None, 1e-12, scales, 60, torch.uint8, 127)
    assert q.shape == (2, 3, 40) and int(q.max()) == 127 and int(q.min()) == 0
    assert torch.equal(q.double(), quantize(y, scales, 60, 0, 127))


def test_zero_point_at_the_top_of_the_range():
    """An int8 activation whose calibrated range is all <= 0 has zero point 127 = qmax."""
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(4))
    scales = torch.full((20,), 0.01)
    y, q = ops.layer_norm_quantize(x, None, None, None, 1e-5, scales, 127, torch.int8, 127)
    assert torch.equal(q.double(), quantize(y, scales, 127, -128, 127))


def test_strided_inputs_are_accepted():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(24, 10, generator=g).t()  # [10, 24], not contiguous
    r = torch.randn(24, 10, generator=g).t()
    scales = torch.full((24,), 0.05)
    y, q = ops.layer_norm_quantize(x, r, None, None, 1e-5, scales, 128, torch.uint8, 255)
    assert float((y.double() - reference(x, r, None, None, 1e-5)).abs().max()) < 1e-5


@pytest.mark.parametrize("case, exc, match", [
    (dict(x=torch.zeros(2, 4, dtype=torch.float64)), TypeError, "x must have dtype torch.float32"),
    (dict(residual=torch.zeros(2, 5)), ValueError, "residual must have x's shape"),
    (dict(residual=torch.zeros(3, 4)), ValueError, "residual must have x's shape"),
    (dict(residual=torch.zeros(2, 1)), ValueError, "residual must have x's shape"),
    (dict(residual=torch.zeros(1, 2, 4)), ValueError, "residual must have x's shape"),
    (dict(weight=torch.ones(3)), ValueError, "weight must be 1-D with 4"),
    (dict(bias=torch.ones(4, dtype=torch.float64)), TypeError, "bias must have dtype"),
    (dict(eps=-1.0), ValueError, "eps must be finite"),
    (dict(scales=torch.tensor([0.1, 0.0, 0.1, 0.1])), ValueError, "scales"),
    (dict(dtype=torch.float32), TypeError, "dtype must be torch.uint8 or torch.int8"),
    (dict(zero_point=300), ValueError, "zero_point"),
    (dict(qmax=256), ValueError, "qmax"),
    (dict(x=torch.zeros(2, 0)), ValueError, "non-empty last dimension"),
])
def test_bad_arguments_raise(case, exc, match):
    args = dict(x=torch.zeros(2, 4), residual=None, weight=None, bias=None, eps=1e-5, scales=torch.full((4,), 0.1),
                zero_point=128, dtype=torch.uint8, qmax=255)
    args.update(case)
    if "x" in case and case["x"].shape[-1] == 0:
        args["scales"] = torch.zeros(0)
    with pytest.raises(exc, match=match):
        ops.layer_norm_quantize(*args.values())


def test_opcheck():
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g)
    args = (x, r, torch.rand(32, generator=g) + 0.5, torch.randn(32, generator=g), 1e-5, torch.full((32,), 0.02), 128,
            torch.uint8, 255)
    torch.library.opcheck(ops.layer_norm_quantize.default, args)
    # a residual broadcast over the batch, through the fake impl too
    x3, r3 = torch.randn(2, 3, 32, generator=g), torch.randn(1, 3, 32, generator=g)
    torch.library.opcheck(ops.layer_norm_quantize.default, (x3, r3, None, None, 1e-5, torch.full((32,), 0.02), 128,
                                                             torch.uint8, 255))
