"""algorithms.per_token.output_errors against the fp64 sums on the reference's quantized values,
and what it says of inputs with and without outlying tokens."""
from __future__ import annotations

import torch

from qbackend.algorithms.per_token import SAMPLE_OUTPUTS, output_errors
from qbackend.observers import choose_qparams
from qbackend.ops import reference as R


def _fp64_errors(x, qp, weights, qmax):
    w = torch.cat([wi.double() for wi in weights])
    static = R.dequantize(R.quantize(x, qp.scale, qp.zero_point, qp.dtype).clamp(qp.qmin, qp.qmax), qp.scale,
                          qp.zero_point)
    q, s, z = R.quantize_per_row(x, qmax)
    token = (q.double() - z.double()[:, None]) * s.double()[:, None]
    return [float(((v - x.double()) @ w.t()).pow(2).sum()) for v in (static, token)]


def test_errors_are_the_fp64_sums_and_outlier_tokens_favour_per_token():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 40, generator=g).abs()
    x[::16] *= 40  # every 16th token carries the outliers
    qp = choose_qparams(float(x.min()), float(x.max()), torch.uint8)
    weights = [torch.randn(24, 40, generator=g), torch.randn(8, 40, generator=g)]
    got = output_errors(x, qp, weights, 255)
    want = _fp64_errors(x, qp, weights, 255)
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(got, want)), (got, want)
    assert got[0] > 20 * got[1]


def test_tokens_of_one_range_gain_little_and_7_bit_levels_cost_4x():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 512, generator=g) * 4.0  # every row spans about [0, 4]
    qp = choose_qparams(0.0, float(x.max()), torch.uint8)
    w = [torch.randn(32, 512, generator=g)]
    static, token = output_errors(x, qp, w, 255)
    assert 0.8 < static / token < 1.25
    _, token7 = output_errors(x, qp, w, 127)
    assert 3.0 < token7 / token < 5.0


def test_wide_weights_are_measured_on_a_fixed_sample_of_outputs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 16, generator=g)
    qp = choose_qparams(float(x.min()), float(x.max()), torch.uint8)
    w = torch.randn(SAMPLE_OUTPUTS * 3, 16, generator=g)
    assert output_errors(x, qp, [w], 255) == output_errors(x, qp, [w.clone()], 255)
    full = _fp64_errors(x, qp, [w], 255)
    sampled = output_errors(x, qp, [w], 255)
    assert all(0.2 < s / f < 0.5 for s, f in zip(sampled, full))  # about a third of the rows
