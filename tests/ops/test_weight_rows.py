"""qbackend::quantize_weight_rows (csrc/ops/weight_rows_ops.cpp), the weight quantizer's rounding:
bit for bit its fp64 reference (reference.quantize_weight_rows) on random weights, exact ties, levels
beyond the range and any layout; bad arguments are errors naming them."""
from __future__ import annotations

import pytest
import torch

import qbackend  # noqa: F401  (loads the ops)
from qbackend.ops import reference

op = torch.ops.qbackend.quantize_weight_rows


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (64, 3, 3, 3), (300, 257), (5,)])
@pytest.mark.parametrize("qrange", [(-128, 127), (-127, 127), (-8, 7)])
def test_matches_the_fp64_reference(shape, qrange):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(shape, generator=g) * 3
    scales = torch.rand(shape[0], generator=g) * 0.05 + 1e-3
    q = op(w, scales, *qrange)
    assert q.dtype == torch.int8 and q.shape == w.shape and q.is_contiguous()
    assert torch.equal(q, reference.quantize_weight_rows(w, scales, *qrange))
    assert int(q.min()) >= qrange[0] and int(q.max()) <= qrange[1]


def test_ties_round_to_even_and_the_range_clamps():
    scales = torch.tensor([0.5, 0.25])
    halves = torch.arange(-6, 7, dtype=torch.float32) + 0.5  # k + 0.5: exact ties after the division
    w = torch.stack([halves * 0.5, halves * 0.25])
    q = op(w, scales, -128, 127)
    expected = torch.round(halves.double()).to(torch.int8)  # ties to even: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2
    assert torch.equal(q, torch.stack([expected, expected]))
    big = torch.tensor([[1e30, -1e30, 200.0, -129.4, 127.49]])
    assert op(big, torch.ones(1), -128, 127).tolist() == [[127, -128, 127, -128, 127]]


def test_any_layout_gives_the_contiguous_result():
    w = torch.randn(16, 8, 3, 3).to(memory_format=torch.channels_last)
    scales = torch.rand(16) + 0.01
    q = op(w, scales, -127, 127)
    assert q.is_contiguous() and torch.equal(q, op(w.contiguous(), scales, -127, 127))
    t = torch.randn(9, 40).t() * 5  # [40, 9], transposed strides
    s40 = torch.rand(40) + 0.01
    assert torch.equal(op(t, s40, -128, 127), reference.quantize_weight_rows(t.contiguous(), s40, -128, 127))


@pytest.mark.parametrize("w, scales, qmin, qmax, exc, pattern", [
    (torch.randn(4, 3).double(), torch.ones(4), -128, 127, TypeError, "w must have dtype torch.float32"),
    (torch.randn(4, 3), torch.ones(4).double(), -128, 127, TypeError, "scales must have dtype torch.float32"),
    (torch.randn(4, 3), torch.ones(3), -128, 127, ValueError, "scales must hold one value per output channel"),
    (torch.randn(4, 3), torch.tensor([1.0, 0.0, 1.0, 1.0]), -128, 127, ValueError, "scales must be positive"),
    (torch.randn(4, 3), torch.tensor([1.0, float("nan"), 1.0, 1.0]), -128, 127, ValueError, "positive and finite"),
    (torch.randn(4, 3), torch.ones(4), 5, 4, ValueError, "qmin and qmax"),
    (torch.randn(4, 3), torch.ones(4), -129, 127, ValueError, "qmin and qmax"),
    (torch.tensor(1.0), torch.ones(1), -128, 127, ValueError, "output-channel dim"),
    (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), torch.ones(2), -128, 127, ValueError, "NaN or inf"),
    (torch.tensor([[1.0, 2.0], [float("inf"), 1.0]]), torch.ones(2), -128, 127, ValueError, "NaN or inf"),
])
def test_bad_arguments_name_themselves(w, scales, qmin, qmax, exc, pattern):
    with pytest.raises(exc, match=pattern):
        op(w, scales, qmin, qmax)


def test_empty_weight():
    assert op(torch.empty(0, 4), torch.empty(0), -128, 127).shape == (0, 4)
    assert op(torch.empty(3, 0), torch.ones(3), -128, 127).shape == (3, 0)
