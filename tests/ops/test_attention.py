"""qbackend::attention (csrc/ops/attention_ops.cpp, kernels/attention_avx512*.cpp) against an fp64
reference: softmax(scale * q k^T + mask) v computed in float64 from the same inputs.

fp32 products: within 1e-5 of the reference (relative to max|v|); quantized outputs within one
level of the fp64 value quantized; bf16 products (where the CPU has AVX512-BF16): within the
bf16 rounding of q * scale, k, P and v (2**-7 of max|v|, checked against the reference on the
bf16-rounded operands too); every mask kind and broadcast, causal, strided views, tails of every
tile (Sq, Sk, D, Dv not multiples of 8/16/32/64), fully masked rows, and the argument checks.
Also run with QBACKEND_ISA=avx2 in CI, where the op falls back to ATen's SDPA.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import attention
from tests.ops.numerics import all_threads

ops = torch.ops.qbackend
BF16 = bool(_C.bf16_usable())


@pytest.fixture
def bf16_products_on():
    """bf16 products wherever AVX512-BF16 runs (policy "on"), also on CPUs where they do not pay
    (Intel's), so that their numerics are tested on every AVX512-BF16 machine."""
    before = _C.bf16_products_policy()
    _C.set_bf16_products_policy("on")
    yield
    _C.set_bf16_products_policy(before)


def reference(q, k, v, mask=None, scale=None, causal=False):
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v


def bf16(t):
    return t.to(torch.bfloat16).double()


def qkv(B, H, Sq, Sk, D, Dv, g, dtype=torch.float32):
    return (torch.randn(B, H, Sq, D, generator=g).to(dtype), torch.randn(B, H, Sk, D, generator=g).to(dtype),
            torch.randn(B, H, Sk, Dv, generator=g).to(dtype))


SHAPES = [(1, 1, 1, 1, 1, 1), (2, 3, 17, 19, 64, 64), (1, 2, 5, 37, 33, 70), (2, 1, 9, 40, 16, 130),
          (1, 2, 33, 31, 7, 5), (3, 2, 8, 64, 64, 64), (1, 1, 70, 129, 80, 48)]


def masks(B, H, Sq, Sk, g):
    yield "none", None
    keep = torch.rand(B, 1, Sq, Sk, generator=g) > 0.3
    keep[..., 0] = True
    yield "bool [B,1,Sq,Sk]", keep
    yield "bool [B,1,1,Sk] (padding)", torch.rand(B, 1, 1, Sk, generator=g) > 0.2
    yield "float [B,H,1,Sk]", torch.randn(B, H, 1, Sk, generator=g)
    yield "float [Sq,Sk]", torch.randn(Sq, Sk, generator=g)
    yield "bf16 [B,H,Sq,Sk]", torch.randn(B, H, Sq, Sk, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_products_match_fp64(shape):
    g = torch.Generator().manual_seed(sum(shape))
    q, k, v = qkv(*shape, g)
    vmax = float(v.abs().max())
    for name, mask in masks(*shape[:4], g):
        for scale in (None, 0.3):
            y = attention(q, k, v, mask, scale)
            ref = reference(q, k, v, mask, scale)
            assert y.dtype == torch.float32 and y.shape == ref.shape
            err = float((y.double() - ref).abs().max())
            assert err <= 1e-5 * vmax, f"{name} scale={scale}: {err}"
    y = attention(q, k, v, is_causal=True)
    assert float((y.double() - reference(q, k, v, causal=True)).abs().max()) <= 1e-5 * vmax


@pytest.mark.parametrize("shape", SHAPES[1:5], ids=lambda s: "x".join(map(str, s)))
def test_bf16_products_within_bf16_rounding(shape, bf16_products_on):
    g = torch.Generator().manual_seed(7 + sum(shape))
    q, k, v = qkv(*shape, g)
    scale = 0.25
    vmax = float(v.abs().max())
    for name, mask in masks(*shape[:4], g):
        y = attention(q, k, v, mask, scale, bf16_products=True).double()
        exact = reference(q, k, v, mask, scale)
        if not BF16:  # the flag is ignored: fp32 products
            assert float((y - exact).abs().max()) <= 1e-5 * vmax
            continue
        # the same operands rounded as the kernel rounds them (P's rounding is the rest)
        rounded = reference(bf16(q.float() * scale), bf16(k), bf16(v), mask, 1.0)
        assert float((y - rounded).abs().max()) <= 2 ** -8 * vmax, name
        assert float((y - exact).abs().max()) <= 2 ** -6 * vmax, name
        assert not torch.equal(y, attention(q, k, v, mask, scale).double()), "bf16 products changed nothing"


def test_bf16_products_only_where_they_pay():
    """Policy "off" (and "auto" where bf16 dot products measure slower than fp32 FMAs, as on Intel's
    AVX512-BF16 Xeons): bf16_products=True runs the fp32 products, bit for bit; the measured rates
    are real numbers and "auto" follows them; a bad policy is refused."""
    g = torch.Generator().manual_seed(5)
    q, k, v = qkv(2, 3, 19, 21, 32, 24, g)
    before = _C.bf16_products_policy()
    try:
        _C.set_bf16_products_policy("off")
        assert not _C.bf16_products_pay()
        assert torch.equal(attention(q, k, v, None, 0.3, bf16_products=True), attention(q, k, v, None, 0.3))
        _C.set_bf16_products_policy("auto")
        if BF16:
            fma, dot = _C.fma_gflops(), _C.bf16_dot_gflops()
            assert fma > 1.0 and dot > 1.0
            pays = _C.bf16_products_pay()
            # the measured decision (once per process): robust, the rates differ by 2x either way here
            assert pays == (dot >= 1.25 * fma) or abs(dot / fma - 1.25) < 0.3
            same = torch.equal(attention(q, k, v, None, 0.3, bf16_products=True), attention(q, k, v, None, 0.3))
            assert same == (not pays)
        else:
            assert not _C.bf16_products_pay() and _C.bf16_dot_gflops() == 0.0
        with pytest.raises(ValueError, match="'auto', 'on' or 'off'"):
            _C.set_bf16_products_policy("always")
    finally:
        _C.set_bf16_products_policy(before)


def test_bf16_inputs_are_widened_exactly():
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(2, 2, 11, 13, 24, 20, g, torch.bfloat16)
    y = attention(q, k, v, None, 0.5)
    assert float((y.double() - reference(q, k, v, None, 0.5)).abs().max()) <= 1e-5 * float(v.abs().max())


@pytest.mark.parametrize("out_dtype", [torch.uint8, torch.int8])
def test_quantized_output_within_one_level(out_dtype):
    g = torch.Generator().manual_seed(11)
    q, k, v = qkv(2, 3, 21, 23, 32, 40, g)
    keep = torch.rand(2, 1, 21, 23, generator=g) > 0.2
    keep[..., 0] = True
    ref = reference(q, k, v, keep, 0.2)
    lo, hi = (0, 255) if out_dtype == torch.uint8 else (-128, 127)
    # a scale that fits the range, and one that saturates most values
    for scale, zp in ((float(ref.abs().max()) / 100, 128 if out_dtype == torch.uint8 else 0), (0.004, lo + 3)):
        y = attention(q, k, v, keep, 0.2, out_dtype=out_dtype, out_scale=scale, out_zero_point=zp)
        assert y.dtype == out_dtype
        want = (ref / scale).round().add(zp).clamp(lo, hi)
        assert float((y.double() - want).abs().max()) <= 1, (scale, zp)


def test_fully_masked_rows_give_zero():
    g = torch.Generator().manual_seed(5)
    q, k, v = qkv(1, 2, 6, 9, 16, 16, g)
    keep = torch.ones(1, 1, 6, 9, dtype=torch.bool)
    keep[0, 0, 2] = False
    neg = torch.zeros(1, 1, 6, 9)
    neg[0, 0, 4] = float("-inf")
    for mask, row in ((keep, 2), (neg, 4)):
        y = attention(q, k, v, mask)
        assert torch.equal(y[:, :, row], torch.zeros_like(y[:, :, row]))
        assert torch.allclose(y, F.scaled_dot_product_attention(q, k, v, mask), atol=1e-5)
        yq = attention(q, k, v, mask, out_dtype=torch.uint8, out_scale=0.01, out_zero_point=77)
        assert bool((yq[:, :, row] == 77).all())


def test_strided_views_and_output_layout():
    """q, k, v as a Linear's [B, S, H*D] output viewed [B, S, H, D] and transposed (no copy), and
    the output's transpose(1, 2) contiguous; a non-contiguous last dimension is copied."""
    g = torch.Generator().manual_seed(2)
    B, S, H, D = 2, 19, 4, 24
    x = torch.randn(B, S, 3, H, D, generator=g)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    y = attention(q, k, v)
    assert y.transpose(1, 2).is_contiguous() and y.shape == (B, H, S, D)
    ref = reference(q, k, v)
    assert float((y.double() - ref).abs().max()) <= 1e-5 * float(v.abs().max())
    qt = q.contiguous().transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride != 1
    assert qt.stride(-1) != 1
    assert float((attention(qt, k, v).double() - ref).abs().max()) <= 1e-5 * float(v.abs().max())


def test_threads_split_few_heads():
    """One head and many rows: the rows are split across threads; same result as one thread."""
    g = torch.Generator().manual_seed(9)
    q, k, v = qkv(1, 1, 300, 77, 64, 64, g)
    y1 = attention(q, k, v)
    with all_threads():
        y2 = attention(q, k, v)
    assert torch.equal(y1, y2)


def test_empty_and_keyless():
    q = torch.randn(2, 1, 0, 8)
    assert attention(q, torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)).shape == (2, 1, 0, 8)
    y = attention(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 0, 8), torch.randn(1, 1, 0, 4),
                  out_dtype=torch.uint8, out_scale=0.1, out_zero_point=9)
    assert y.shape == (1, 1, 3, 4) and bool((y == 9).all())


@pytest.mark.parametrize("case, exc, match", [
    (dict(q=torch.zeros(1, 1, 2, 4, dtype=torch.int32)), TypeError, "q must be float32 or bfloat16"),
    (dict(k=torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16)), TypeError, "k must have q's dtype"),
    (dict(q=torch.zeros(1, 2, 4)), ValueError, "4-D"),
    (dict(k=torch.zeros(1, 2, 2, 4)), ValueError, "same batch and head"),
    (dict(k=torch.zeros(1, 1, 2, 5)), ValueError, "head_dim"),
    (dict(v=torch.zeros(1, 1, 3, 4)), ValueError, "sequence length"),
    (dict(mask=torch.ones(1, 1, 3, 2, dtype=torch.bool)), ValueError, "does not broadcast"),
    (dict(mask=torch.ones(1, 1, 2, 2, dtype=torch.int64)), TypeError, "mask must be bool"),
    (dict(mask=torch.ones(2, 2, dtype=torch.bool), is_causal=True), ValueError, "not both"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(out_dtype=torch.uint8, out_scale=0.0), ValueError, "output_scale"),
    (dict(out_dtype=torch.int8, out_zero_point=200), ValueError, "output_zero_point"),
    (dict(out_dtype=torch.float16), TypeError, "output_dtype"),
])
def test_bad_arguments_raise(case, exc, match):
    args = dict(q=torch.zeros(1, 1, 2, 4), k=torch.zeros(1, 1, 2, 4), v=torch.zeros(1, 1, 2, 4), mask=None, scale=0.5,
                is_causal=False, out_dtype=torch.float32, out_scale=1.0, out_zero_point=0)
    args.update(case)
    with pytest.raises(exc, match=match):
        ops.attention(args["q"], args["k"], args["v"], args["mask"], args["scale"], args["is_causal"],
                      args["out_dtype"], args["out_scale"], args["out_zero_point"])


def test_opcheck_and_export():
    g = torch.Generator().manual_seed(1)
    q, k, v = qkv(2, 2, 5, 6, 8, 8, g)
    mask = torch.rand(2, 1, 5, 6, generator=g) > 0.2
    torch.library.opcheck(ops.attention.default, (q, k, v, mask, 0.3, False, torch.uint8, 0.01, 128, False))
    torch.library.opcheck(ops.attention.default, (q, k, v, None, 0.3, True, torch.float32, 1.0, 0, True))

    class M(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return attention(q, k, v, mask, out_dtype=torch.uint8, out_scale=0.01, out_zero_point=128)

    ep = torch.export.export(M(), (q, k, v, mask))
    assert torch.equal(ep.module()(q, k, v, mask), M()(q, k, v, mask))
