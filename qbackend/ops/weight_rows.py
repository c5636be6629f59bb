"""The fake (meta) impl of torch.ops.qbackend.quantize_weight_rows (csrc/ops/weight_rows_ops.cpp): a
float32 weight [N, ...] to its int8 levels with one scale per output channel, the division and the
rounding in float64 (the weight quantizer's, qbackend/nn/weights.py). Its semantics:
reference.quantize_weight_rows."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)


@torch.library.register_fake("qbackend::quantize_weight_rows")
def _quantize_weight_rows_fake(w, scales, qmin, qmax):
    torch._check_value(w.dim() >= 1, lambda: "w must have an output-channel dim, got a 0-D tensor")
    return torch.empty(w.shape, dtype=torch.int8, device=w.device)
