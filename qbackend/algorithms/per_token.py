"""Per-token or per-tensor activations for a Linear's input: the output error of each on sampled
calibration rows, from which the lowering chooses (lowering/per_token.py).

A static range is one scale for every token. Where a few tokens carry the outliers (the GELU
output a transformer FFN's down projection reads: "massive activations" on delimiter and first
tokens, Sun et al., "Massive Activations in Large Language Models", 2024; Bondarenko et al.,
"Understanding and Overcoming the Challenges of Efficient Transformer Quantization", 2021), that
scale spends most of its levels on them and every other token keeps few. Quantizing each row over
its own range at run time (qbackend::quantize_per_row) gives every token all 256 levels, at the
cost of one pass over the row and a float input.

`output_errors` measures both on the same rows, through the Linears' float weights (sampled output
channels, `sampling.sampled_rows`): sum over the Linears of |Q(X) W^T - X W^T|^2, Q the static
quantize-dequantize with the value's qparams, or the per-row one. The weights' own rounding is
the same either way, so it is left out.
"""
from __future__ import annotations

import torch

from ..observers import QParams
from .sampling import sampled_rows
from .smoothquant import fake_quantize

__all__ = ["output_errors", "SAMPLE_OUTPUTS"]

SAMPLE_OUTPUTS = 256  # output channels of each Linear the errors are measured on


def _per_row(x: torch.Tensor, qmax: int) -> torch.Tensor:
    q, scale, zp = torch.ops.qbackend.quantize_per_row(x, qmax)
    return (q.float() - zp.float()[:, None]) * scale[:, None]


@torch.no_grad()
def output_errors(sample: torch.Tensor, qp: QParams, weights: list[torch.Tensor], qmax: int) -> tuple[float, float]:
    """(static error, per-token error) of the Linears reading `sample` ([rows, K] float32, finite):
    the summed squared output error of the value quantized with `qp`, and of each row quantized over
    its own range with levels [0, qmax]."""
    w = torch.cat([wi.detach().float() if (r := sampled_rows(wi.shape[0], SAMPLE_OUTPUTS)) is None
                   else wi.detach().float()[r] for wi in weights])
    x = sample.float()
    errors = []
    for xq in (fake_quantize(x, qp), _per_row(x, qmax)):
        errors.append(float(((xq - x) @ w.t()).double().pow(2).sum()))
    return errors[0], errors[1]
