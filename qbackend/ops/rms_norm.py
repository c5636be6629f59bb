"""Fake (meta) impl of torch.ops.qbackend.rms_norm, the decoder LLMs' RMSNorm (the C++ op in
csrc/ops/rms_norm_ops.cpp documents it; qbackend.nn.RMSNorm is its user), so torch.compile and
torch.export trace it."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::rms_norm")
def _rms_norm_fake(x, weight, eps):
    torch._check_value(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                       lambda: f"weight must be 1-D with x's last dimension {x.shape[-1]}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)
