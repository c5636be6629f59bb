"""4-bit group-wise weights: the quantizer (qbackend.nn.int4_linear.quantize_int4: each weight at its
nearest level of its group, the levels in range, the packing two to a byte in k order) and the op
qbackend::woq4_linear against fp64 math on the same dequantized weights (scale * u + offset, one
float32 rounding; the op takes the row tiles of the packed weight), on the AVX512, AVX2 and scalar
kernels and the panel path, for every group size,
partial last groups, odd K, both symmetries; bad arguments are errors naming them."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from qbackend.nn import Int4WeightOnlyLinear
from qbackend.nn.int4_linear import GROUP_SIZES, dequantize_int4, quantize_int4

from qbackend.nn.weight_tiles import tile_groups, tile_rows

from .isa_children import outputs_on_every_isa

OP = torch.ops.qbackend.woq4_linear
SHAPES = [(1, 16, 4, 16), (2, 33, 5, 16), (3, 100, 9, 32), (4, 576, 13, 128), (5, 64, 70, 64), (16, 257, 3, 256),
          (17, 48, 9, 16), (64, 40, 5, 16), (65, 33, 7, 32), (300, 40, 6, 32)]  # (M, K, N, group); from 65 rows: panels


def _case(m, k, n, g, seed, symmetric=False, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen) * 2
    b = torch.randn(n, generator=gen) if bias else None
    packed, scales, offsets = quantize_int4(w, g, symmetric)
    return x, packed, scales, offsets, g, k, b, w


def tiled(x, packed, scales, offsets, g, k, b):
    """The op's arguments for these weights: the row tiles of the packed weight, the group tiles of
    its scales and offsets, and out_features."""
    return x, tile_rows(packed), tile_groups(scales), tile_groups(offsets), g, k, packed.shape[0], b


def _check(y, x, packed, scales, offsets, g, k, b):
    wd = dequantize_int4(packed, scales, offsets, g, k).double()
    xd = x.double()
    ref = xd @ wd.T + (b.double() if b is not None else 0)
    bound = (xd.abs() @ wd.abs().T) * (k + 3) * 2 ** -24 + (b.double().abs() if b is not None else 0) * 2 ** -23
    err = (y.double() - ref).abs()
    assert y.shape == ref.shape and bool((err <= bound + 1e-30).all()), float((err / (bound + 1e-30)).max())


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("g", GROUP_SIZES)
def test_quantizer_nearest_level_of_each_group(g, symmetric):
    x, packed, scales, offsets, g, k, b, w = _case(1, 300, 7, g, g, symmetric)
    groups = -(-300 // g)
    assert packed.shape == (7, 150) and scales.shape == offsets.shape == (7, groups)
    u = torch.stack([packed & 15, packed >> 4], dim=2).reshape(7, -1)
    assert int(u.max()) <= 15
    assert scales.dtype == offsets.dtype == torch.float16
    wd = dequantize_int4(packed, scales, offsets, g, 300)
    s = scales.float().repeat_interleave(g, dim=1)[:, :300]
    assert bool(((wd - w).abs() <= s / 2 * (1 + 1e-5)).all())  # nearest level (none clipped)
    if symmetric:
        torch.testing.assert_close(offsets, -8 * scales, rtol=0, atol=0)
        amax = nn.functional.pad(w.abs(), (0, groups * g - 300)).reshape(7, groups, g).amax(2)
        assert bool((scales.float() >= amax * 2 / 15).all())  # rounded up: [-amax, amax] inside the grid
        assert bool((scales.float() <= amax * 2 / 15 * (1 + 2 ** -10)).all())
    else:  # each group's minimum is its level 0 to float16's rounding (the nearest float16 here)
        lo = nn.functional.pad(w, (0, groups * g - 300), value=float("inf")).reshape(7, groups, g).amin(2)
        assert torch.equal(offsets, lo.half())


def test_q4_1_blocks_are_kept_exactly():
    """Weights made of GGUF Q4_1 blocks (float16 d and m, w = d * q + m in float32, q = 0..15 with both
    ends used): the grid is each block's own d and m, and the levels its q."""
    gen = torch.Generator().manual_seed(3)
    d = (torch.rand(6, 4, generator=gen) * 0.01 + 1e-4).half()
    m = (torch.randn(6, 4, generator=gen) * 0.05).half()
    q = torch.randint(0, 16, (6, 4, 32), generator=gen)
    q[:, :, 0], q[:, :, 1] = 0, 15
    w = (d.float()[..., None] * q + m.float()[..., None]).reshape(6, 128)
    packed, scales, offsets = quantize_int4(w, 32)
    assert torch.equal(scales, d) and torch.equal(offsets, m)
    u = torch.stack([packed & 15, packed >> 4], dim=2).reshape(6, 4, 32)
    assert torch.equal(u.long(), q)


def test_grid_covers_groups_far_from_zero_and_rejects_float16_overflow():
    """A group whose values sit far from 0 (its minimum's nearest float16 a whole step above it): the grid's
    offset rounded down and its scale up, so no weight is more than half a step from a level."""
    for lo in (100.04, 100.03, 100.0, 7e-6):  # 100.04's nearest float16 is 100.0625, a range above it
        w = lo + torch.linspace(0, 0.01 if lo > 1 else 1e-6, 32).reshape(1, 32)
        packed, scales, offsets = quantize_int4(w, 32)
        lo, hi = float(w.min()), float(w.max())
        assert float(offsets) <= lo + float(scales) / 2 and float(offsets) + 15.5 * float(scales) >= hi
        if lo > 1:  # no coarser than it must be (a subnormal scale is as fine as float16 goes)
            assert 15 * float(scales) <= (hi - float(offsets)) * (1 + 2 ** -9)
        wd = dequantize_int4(packed, scales, offsets, 32, 32)
        assert float((wd - w).abs().max()) <= float(scales) / 2 * (1 + 1e-5)
        x = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))  # float16 subnormals for lo = 7e-6
        _check(OP(*tiled(x, packed, scales, offsets, 32, 32, None)), x, packed, scales, offsets, 32, 32, None)
    for symmetric in (False, True):
        with pytest.raises(ValueError, match="do not fit float16 group scales"):
            quantize_int4(torch.tensor([[0.0, 1e6]]), 16, symmetric)
    with pytest.raises(ValueError, match="scales must be finite"):
        Int4WeightOnlyLinear(packed, torch.full((1, 1), 1e5), offsets, None, 32, 32, False)


def test_packing_order_and_odd_k():
    w = torch.tensor([[0.0, 1.0, 2.0, 3.0, 15.0]])  # asymmetric: min 0, scale 1: levels are the values
    packed, scales, offsets = quantize_int4(w, 16)
    assert torch.equal(packed, torch.tensor([[0x10, 0x32, 0x0F]], dtype=torch.uint8))
    assert scales.tolist() == [[1.0]] and offsets.tolist() == [[0.0]]
    assert torch.equal(dequantize_int4(packed, scales, offsets, 16, 5), w)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("m,k,n,g", SHAPES)
def test_matches_fp64_on_the_same_weights(m, k, n, g, symmetric):
    for bias in (True, False):
        x, packed, scales, offsets, g, k, b, _ = _case(m, k, n, g, m + k + n + g, symmetric, bias)
        _check(OP(*tiled(x, packed, scales, offsets, g, k, b)), x, packed, scales, offsets, g, k, b)


def test_every_isa_kernel(tmp_path):
    cases = [_case(m, k, n, g, 3 * m + k, sym)[:7] for m, k, n, g in SHAPES if m <= 17 for sym in (False, True)]
    args = [tiled(*case) for case in cases]
    for outs in outputs_on_every_isa(tmp_path, "woq4_linear", args).values():
        for case, y in zip(cases, outs):
            _check(y, *case)


def test_module_other_dtypes_and_export():
    torch.manual_seed(0)
    lin = nn.Linear(40, 6)
    q = Int4WeightOnlyLinear.from_float(lin, group_size=16, symmetric=True)
    x = torch.randn(2, 3, 40)
    y = q(x)
    torch.testing.assert_close(y, nn.functional.linear(x, q.dequantized_weight(), lin.bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q(x.bfloat16()).float(), y, rtol=0.05, atol=0.05)
    ep = torch.export.export(q, (x,))
    assert any("woq4_linear" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), y, rtol=0, atol=0)


def test_bad_arguments_name_themselves():
    x, packed, scales, offsets, g, k, b, w = _case(2, 64, 5, 32, 1)
    with pytest.raises(ValueError, match="group_size must be a positive multiple of 16"):
        OP(*tiled(x, packed, scales, offsets, 24, k, b))
    args = tiled(x, packed, scales, offsets, g, k, b)
    w_t, s_t, o_t = args[1:4]
    with pytest.raises(ValueError, match=r"w must be the row tiles of the 4-bit .*\[2, 3, 64\] for 5 output channels of 33"):
        OP(torch.randn(2, 66), w_t, tile_groups(torch.ones(5, 3)), tile_groups(torch.ones(5, 3)), g, 66, 5, b)
    with pytest.raises(ValueError, match=r"w must be the row tiles .*got \[5, 32\]"):
        OP(x, packed, s_t, o_t, g, k, 5, b)  # the packed weight, not its tiles
    with pytest.raises(ValueError, match=r"w must be the row tiles .*\[1, 2, 64\] for 3 output channels"):
        OP(x, w_t, tile_groups(scales[:3]), tile_groups(offsets[:3]), g, k, 3, b[:3])  # out_features
    with pytest.raises(ValueError, match="x's last dimension must be in_features 64"):
        OP(torch.randn(2, 63), w_t, s_t, o_t, g, k, 5, b)
    with pytest.raises(ValueError, match=r"scales must be the group tiles .*\[2, 2, 4\], got \[5, 2\]"):
        OP(x, w_t, scales, offsets, g, k, 5, b)  # row-major scales
    with pytest.raises(ValueError, match=r"scales must be the group tiles .*\[2, 2, 4\], got \[2, 1, 4\]"):
        OP(x, w_t, s_t[:, :1], o_t, g, k, 5, b)
    with pytest.raises(ValueError, match="offsets must have the shape of scales"):
        OP(x, w_t, s_t, o_t[:, :1], g, k, 5, b)
    with pytest.raises(TypeError, match="w must have dtype torch.uint8"):
        OP(x, w_t.to(torch.int8), s_t, o_t, g, k, 5, b)
    with pytest.raises(ValueError, match="out_features must be >= 0"):
        OP(x, w_t, s_t, o_t, g, k, -1, b)
    with pytest.raises(ValueError, match="group_size must be one of 16, 32, 64, 128, 256"):
        quantize_int4(w, 48)
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize_int4(torch.tensor([[float("nan"), 1.0]]), 16)
