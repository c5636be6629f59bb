"""Fake (meta) impl of torch.ops.qbackend.woq_linear, the weight-only int8 Linear (the C++ op in
csrc/ops/woq_ops.cpp documents it; qbackend.nn.WeightOnlyLinear is its user), so torch.compile and
torch.export trace it."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::woq_linear")
def _woq_linear_fake(x, w, scales, bias=None):
    torch._check_value(w.dim() == 2, lambda: f"w must be 2-D [N, K], got {w.dim()}-D")
    torch._check_value(x.shape[-1] == w.shape[1],
                       lambda: f"x's last dimension must be the weight's in_features {w.shape[1]}, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], w.shape[0]))
