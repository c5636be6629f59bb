"""int4 weights against int8 activations (qbackend::woq4a8_linear, W4A8): the activations quantized by
blocks of 32 features (scale max |x| / 127, rounded half to even: the same float32 operations in
torch here), then checked against fp64 math on those integers and the exact weights scale * u + offset,
(the op given the row tiles of the packed weight) on the AVX512-VNNI, AVX2 and scalar kernels and the
panel path, for every group size, partial blocks
and groups, odd K; non-finite inputs give NaN rows; bad arguments are errors naming them."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from qbackend.nn import Int4WeightOnlyLinear
from qbackend.nn.int4_linear import quantize_int4

from .isa_children import assert_equal_on_every_isa, outputs_on_every_isa, with_awkward_rows
from .test_woq4_linear import tiled

OP = torch.ops.qbackend.woq4a8_linear
SHAPES = [(1, 7, 3, 16), (1, 576, 70, 32), (2, 33, 5, 16), (3, 100, 9, 32), (4, 1536, 13, 64), (5, 129, 70, 128),
          (16, 257, 3, 256), (17, 48, 9, 16), (129, 33, 5, 32), (300, 40, 6, 32),
          (511, 40, 6, 32), (512, 40, 6, 32), (1030, 40, 6, 32)]  # (M, K, N, group); from 512 rows: panels


def _case(m, k, n, g, seed, symmetric=False, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen) * 2
    x[:, :min(k, 5)] *= 40  # an outlier block
    b = torch.randn(n, generator=gen) if bias else None
    packed, scales, offsets = quantize_int4(w, g, symmetric)
    return x, packed, scales, offsets, g, k, b


def block_quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq as float [M, K] integers, each value's block scale d [M, K]) in float32, as the op makes them."""
    m, k = x.shape
    pad = (-k) % 32
    xb = nn.functional.pad(x, (0, pad)).reshape(m, -1, 32)
    d = xb.abs().amax(dim=2, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(xb))
    return q.reshape(m, -1)[:, :k], d.expand_as(xb).reshape(m, -1)[:, :k]


def _check(y, x, packed, scales, offsets, g, k, b):
    n = packed.shape[0]
    u = torch.stack([packed & 15, packed >> 4], dim=2).reshape(n, -1)[:, :k].double()
    w = scales.double().repeat_interleave(g, 1)[:, :k] * u + offsets.double().repeat_interleave(g, 1)[:, :k]
    q, d = block_quantized(x)
    assert q.abs().max() <= 127
    xd = q.double() * d.double()
    ref = xd @ w.T + (b.double() if b is not None else 0)
    # float32: one rounding per product of scales, per accumulation (K / 8 lanes, the group sums) and the bias
    bound = (xd.abs() @ w.abs().T) * (k // 4 + (k + g - 1) // g + 8) * 2 ** -24 \
        + (b.double().abs() if b is not None else 0) * 2 ** -23
    err = (y.double() - ref).abs()
    assert y.shape == ref.shape and bool((err <= bound + 1e-30).all()), float((err / (bound + 1e-30)).max())


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("m,k,n,g", SHAPES)
def test_matches_fp64_on_the_same_integers(m, k, n, g, symmetric):
    x, packed, scales, offsets, g, k, b = _case(m, k, n, g, m * 1000 + k + n + g, symmetric, bias=(m % 2 == 1))
    _check(OP(*tiled(x, packed, scales, offsets, g, k, b)), x, packed, scales, offsets, g, k, b)


def test_every_isa_kernel(tmp_path):
    """Each ISA's kernel in a child process capped to it (AVX512-VNNI where this CPU has it)."""
    cases = [_case(m, k, n, g, 11 + m + k) for m, k, n, g in SHAPES if m <= 17]
    args = [tiled(*case) for case in cases]
    for outs in outputs_on_every_isa(tmp_path, "woq4a8_linear", args, isa_fn="woq_a8_isa", top="avx512_vnni",
                                     top_level=3).values():
        for case, y in zip(cases, outs):
            _check(y, *case)


def test_activation_quantization_is_the_same_on_every_isa(tmp_path):
    """From 512 rows the quantized activations are dequantized into float panels, so the ISA's row
    quantizer is the only step that depends on the ISA: the outputs are equal bit for bit (K tails and
    isa_children.with_awkward_rows)."""
    cases = []
    for m, k, n, g in [(1030, 40, 6, 32), (1100, 97, 5, 16), (1025, 256, 3, 128)]:
        x, *rest = _case(m, k, n, g, 13 * m + k)
        cases.append(tiled(with_awkward_rows(x), *rest))
    assert_equal_on_every_isa(outputs_on_every_isa(tmp_path, "woq4a8_linear", cases, isa_fn="woq_a8_isa",
                                                   top="avx512_vnni", top_level=3))


def test_close_to_float_activations_and_leading_dims():
    """Within the activations' rounding of the float-activation op, for 3-D inputs too."""
    x, packed, scales, offsets, g, k, b = _case(2, 576, 40, 32, 5)
    x = x.reshape(2, 1, 576).expand(2, 3, 576)
    args = tiled(x, packed, scales, offsets, g, k, b)
    y, yf = OP(*args), torch.ops.qbackend.woq4_linear(*args)
    assert y.shape == (2, 3, 40)
    assert float((y - yf).norm() / yf.norm()) < 0.02


def test_non_finite_inputs_give_nan_rows():
    x, packed, scales, offsets, g, k, b = _case(3, 64, 8, 32, 9)
    x[1, 40] = float("inf")
    y = OP(*tiled(x, packed, scales, offsets, g, k, b))
    assert bool(torch.isnan(y[1]).all()) and bool(torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all())
    _check(y[0::2], x[0::2], packed, scales, offsets, g, k, b)


def test_module_and_export():
    lin = nn.Linear(96, 10)
    q = Int4WeightOnlyLinear.from_float(lin, 32, activations="int8")
    assert "activations=int8" in repr(q)
    x = torch.randn(4, 96)
    y = q(x)
    torch.testing.assert_close(y, OP(*tiled(x, q.weight_packed, q.scales, q.offsets, 32, 96, q.bias)), rtol=0, atol=0)
    ep = torch.export.export(q, (x,))
    assert any("woq4a8_linear" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), y, rtol=0, atol=0)
    with pytest.raises(ValueError, match="activations must be one of"):
        Int4WeightOnlyLinear.from_float(lin, 32, activations="int4")


def test_bad_arguments_name_themselves():
    x, packed, scales, offsets, g, k, b = _case(2, 96, 5, 32, 3)
    with pytest.raises(ValueError, match="power of two"):
        OP(*tiled(x, packed, scales[:, :2], offsets[:, :2], 48, k, b))
    with pytest.raises(ValueError, match="in_features 96, got 95"):
        OP(*tiled(x[:, :95], packed, scales, offsets, g, k, b))
    with pytest.raises(TypeError, match="x must have dtype torch.float32"):
        OP(*tiled(x.double(), packed, scales, offsets, g, k, b))
    with pytest.raises(ValueError, match="bias must hold 5 values"):
        OP(*tiled(x, packed, scales, offsets, g, k, b[:3]))
