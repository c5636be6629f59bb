"""qbackend::woq_linear, the weight-only int8 Linear (csrc/ops/woq_ops.cpp, csrc/kernels/woq_*.cpp):
against fp64 math on the same int8 weights and float32 inputs, within float32 accumulation error,
(given as their row tiles, qbackend.nn.weight_tiles) on the AVX512, AVX2 and scalar kernels (children
capped to each ISA), for row counts on both sides
of the kernel's four-row passes and of its switch to dequantized panels, K tails of every length,
output-channel tails and blocks; bad arguments are errors naming them."""
from __future__ import annotations

import pytest
import torch

from qbackend.nn.weight_tiles import tile_rows as T

from .isa_children import outputs_on_every_isa

OP = torch.ops.qbackend.woq_linear
SHAPES = [(1, 1, 1), (1, 7, 5), (2, 16, 4), (3, 33, 9), (4, 100, 13), (5, 17, 70), (16, 130, 3), (17, 64, 257),
          (24, 40, 7), (25, 40, 7), (40, 24, 1100), (257, 40, 9), (300, 48, 20)]  # (M, K, N); from 25 rows: panels


def _case(m, k, n, seed, bias=True, lead=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, m, k, generator=g) * 3
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g) * 0.02 + 1e-4
    b = torch.randn(n, generator=g) if bias else None
    return x, w, s, b


def _check(y, x, w, s, b):
    """|y - fp64| within float32 accumulation: K roundings of terms up to |x| |w| s, plus the bias."""
    xd, wd = x.double(), w.double() * s.double()[:, None]
    ref = xd @ wd.T + (b.double() if b is not None else 0)
    bound = (xd.abs() @ wd.abs().T) * (x.shape[-1] + 2) * 2 ** -24 + (b.double().abs() if b is not None else 0) \
        * 2 ** -23 + 1e-30
    assert y.dtype == torch.float32 and y.shape == ref.shape
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_fp64_on_the_same_integers(m, k, n):
    for bias in (True, False):
        x, w, s, b = _case(m, k, n, m * 1000 + k * 10 + n, bias)
        _check(OP(x, T(w), s, b), x, w, s, b)


def test_leading_dims_and_strided_inputs():
    x, w, s, b = _case(3, 40, 12, 1, lead=(2,))
    y = OP(x, T(w), s, b)
    assert y.shape == (2, 3, 12)
    _check(y, x, w, s, b)
    xt = torch.randn(40, 6).t()  # a transposed (non-contiguous) input
    _check(OP(xt, T(w), s, b), xt, w, s, b)
    strided = T(w).transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous tiles, [N, 1] scales
    _check(OP(x, strided, s.reshape(12, 1), b), x, w, s, b)


def test_empty_inputs():
    x, w, s, b = _case(0, 8, 5, 2)
    assert OP(x, T(w), s, b).shape == (0, 5)
    x = torch.randn(3, 0)
    assert torch.equal(OP(x, T(torch.zeros(4, 0, dtype=torch.int8)), torch.ones(4), torch.arange(4.0)),
                       torch.arange(4.0).expand(3, 4))


def test_every_isa_kernel(tmp_path):
    """Each ISA's kernel in a child process capped to it, against fp64 (the three agree to float32
    rounding, not bit for bit: their sums run in different orders)."""
    cases = [_case(m, k, n, 7 + m + k + n) for m, k, n in SHAPES if m <= 40]
    args = [(x, T(w), s, b) for x, w, s, b in cases]
    for outs in outputs_on_every_isa(tmp_path, "woq_linear", args).values():
        for (x, w, s, b), y in zip(cases, outs):
            _check(y, x, w, s, b)


def test_bad_arguments_name_themselves():
    x, w, s, b = _case(2, 8, 5, 3)
    tiles = T(w)
    with pytest.raises(ValueError, match=r"w must be the row tiles .*\[2, 2, 64\] for 5 output channels of 17 bytes"):
        OP(torch.randn(2, 17), tiles, s, b)
    with pytest.raises(TypeError, match="w must have dtype torch.int8"):
        OP(x, tiles.to(torch.uint8), s, b)
    with pytest.raises(TypeError, match="x must have dtype torch.float32"):
        OP(x.double(), tiles, s, b)
    with pytest.raises(ValueError, match=r"\[1, 1, 64\] for 4 output channels of 8 bytes, got \[2, 1, 64\]"):
        OP(x, tiles, s[:4], b)
    with pytest.raises(ValueError, match="scales must be \\[N\\] or \\[N, 1\\]"):
        OP(x, tiles, s.reshape(1, 5), b)
    with pytest.raises(ValueError, match="bias must hold 5 values"):
        OP(x, tiles, s, b[:3])
    with pytest.raises(ValueError, match=r"w must be the row tiles .*got \[5, 8\]"):
        OP(x, w, s, b)  # a row-major weight is not its tiles


def test_traces_under_compile_and_export():
    lin = torch.nn.Linear(24, 6)
    from qbackend.nn import WeightOnlyLinear
    q = WeightOnlyLinear.from_float(lin)
    x = torch.randn(3, 24)
    ep = torch.export.export(q, (x,))
    assert any("woq_linear" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), q(x), rtol=0, atol=0)


def test_fake_impls_are_the_weight_only_ones():
    """The providers' linear fakes are registered for "<provider>_linear" ops only, not for
    woq_linear (whose name also ends in "_linear" but whose signature differs), so a torch that
    refuses a second fake registration for one op imports qbackend."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from qbackend.ops.library import ops_named
    assert "qbackend::woq_linear" not in ops_named("linear")
    assert set(ops_named("linear")) >= {"qbackend::fbgemm_linear", "qbackend::onednn_linear", "qbackend::native_linear"}
    with FakeTensorMode():
        y = OP(torch.randn(3, 8), torch.zeros(2, 1, 64, dtype=torch.int8), torch.ones(5), None)
    assert y.shape == (3, 5)
