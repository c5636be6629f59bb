"""int8 weights against int8 activations (qbackend::woq_a8_linear, W8A8): the activations quantized by
blocks of 32 features as for W4A8, then checked against fp64 math on those integers and the int8
weights with their channel scales, (given as their row tiles) on the AVX512-VNNI, AVX2 and scalar kernels and the panel path,
with weights at -128 and 127 (the VNNI kernel's unsigned operand is w + 128), odd K and K tails;
non-finite inputs give NaN rows; the module and quantize_llm use it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import WeightOnlyLinear
from qbackend.nn.weight_tiles import tile_rows as T

from .isa_children import assert_equal_on_every_isa, outputs_on_every_isa, with_awkward_rows
from .test_woq4a8_linear import block_quantized

OP = torch.ops.qbackend.woq_a8_linear
SHAPES = [(1, 7, 3), (1, 576, 70), (2, 33, 5), (3, 100, 9), (4, 1536, 13), (5, 129, 70), (17, 64, 9), (300, 40, 6),
          (1030, 40, 6)]  # (M, K, N); 1030 rows: panels


def _case(m, k, n, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    w[0, : min(k, 3)] = -128  # the extremes, where a 16-bit or sign trick could overflow
    w[-1, : min(k, 3)] = 127
    x = torch.randn(m, k, generator=gen) * 2
    x[:, : min(k, 5)] *= 40
    s = torch.rand(n, generator=gen) * 0.01 + 1e-3
    b = torch.randn(n, generator=gen) if bias else None
    return x, w, s, b


def _check(y, x, w, s, b):
    q, d = block_quantized(x)
    xd = q.double() * d.double()
    wd = w.double() * s.double()[:, None]
    ref = xd @ wd.T + (b.double() if b is not None else 0)
    k = x.shape[1]
    bound = (xd.abs() @ wd.abs().T) * (k // 4 + 8) * 2 ** -24 + (b.double().abs() if b is not None else 0) * 2 ** -23
    err = (y.double() - ref).abs()
    assert y.shape == ref.shape and bool((err <= bound + 1e-30).all()), float((err / (bound + 1e-30)).max())


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_fp64_on_the_same_integers(m, k, n):
    x, w, s, b = _case(m, k, n, m * 1000 + k + n, bias=(m % 2 == 1))
    _check(OP(x, T(w), s, b), x, w, s, b)


@pytest.mark.parametrize("m,k,n", [(1, 96, 40), (6, 768, 48), (9, 65, 36), (64, 768, 100)])
def test_channels_computed_together_equal_each_tile_alone(m, k, n):
    """The VNNI kernel takes four row tiles (16 channels) a pass where it can and one at a time for the
    rest; every channel's output is the same float as its tile's computed alone."""
    x, w, s, b = _case(m, k, n, 7 * m + k, bias=True)
    y = OP(x, T(w), s, b)
    for t in range(0, n, 4):
        alone = OP(x, T(w[t:t + 4]), s[t:t + 4], b[t:t + 4])
        assert torch.equal(y[:, t:t + 4], alone), t


def test_every_isa_kernel(tmp_path):
    cases = [_case(m, k, n, 5 + m + k) for m, k, n in SHAPES if m <= 17]
    args = [(x, T(w), s, b) for x, w, s, b in cases]
    for outs in outputs_on_every_isa(tmp_path, "woq_a8_linear", args, isa_fn="woq_a8_isa", top="avx512_vnni",
                                     top_level=3).values():
        for case, y in zip(cases, outs):
            _check(y, *case)


def test_activation_quantization_is_the_same_on_every_isa(tmp_path):
    """Beyond 1024 rows the quantized activations are dequantized into float panels for one GEMM, so
    the ISA's row quantizer is the only step that depends on the ISA: the outputs are equal bit for
    bit (K tails and isa_children.with_awkward_rows)."""
    cases = []
    for m, k, n in [(1030, 40, 6), (1100, 97, 5), (1025, 256, 3)]:
        x, w, s, b = _case(m, k, n, 11 * m + k)
        cases.append((with_awkward_rows(x), T(w), s, b))
    assert_equal_on_every_isa(outputs_on_every_isa(tmp_path, "woq_a8_linear", cases, isa_fn="woq_a8_isa",
                                                   top="avx512_vnni", top_level=3))


def test_non_finite_inputs_give_nan_rows():
    x, w, s, b = _case(3, 64, 8, 9)
    x[1, 3] = float("nan")
    y = OP(x, T(w), s, b)
    assert bool(torch.isnan(y[1]).all()) and bool(torch.isfinite(y[0::2]).all())
    _check(y[0::2], x[0::2], w, s, b)


def test_module_quantize_llm_and_export():
    lin = nn.Linear(96, 10)
    q = WeightOnlyLinear.from_float(lin, activations="int8")
    assert "activations=int8" in repr(q)
    x = torch.randn(4, 96)
    torch.testing.assert_close(q(x), OP(x, T(q.weight_int8), q.w_scales, q.bias), rtol=0, atol=0)
    ep = torch.export.export(q, (x,))
    assert any("woq_a8_linear" in str(n.target) for n in ep.graph.nodes)
    plain = WeightOnlyLinear.from_float(lin)
    assert float((q(x) - plain(x)).norm() / plain(x).norm()) < 0.02  # the activations' rounding only
    model = qbackend.quantize_llm(nn.Sequential(nn.Linear(96, 10)), qbackend.LLMConfig(activations="int8"))
    assert model[0].activations == "int8"
    with pytest.raises(ValueError, match="activations must be one of float, int8"):
        WeightOnlyLinear.from_float(lin, activations="int4")


def test_bad_arguments_name_themselves():
    x, w, s, b = _case(2, 8, 5, 3)
    with pytest.raises(ValueError, match="w must be the row tiles .* for 5 output channels of 17 bytes"):
        OP(torch.randn(2, 17), T(w), s, b)
    with pytest.raises(TypeError, match="w must have dtype torch.int8"):
        OP(x, T(w).to(torch.uint8), s, b)
    with pytest.raises(ValueError, match="for 4 output channels of 8 bytes"):
        OP(x, T(w), s[:4], b)
