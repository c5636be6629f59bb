"""RMSNorm: the decoder LLMs' root-mean-square norm (y = weight * (x / sqrt(mean(x^2) + eps)), Llama's
form) as one call of qbackend::rms_norm for float32 inputs; other float dtypes run the same formula in
torch ops (normalized in float32, cast back, then scaled, as Llama's own module does)."""
from __future__ import annotations

import torch
from torch import nn

from ..core.generation import Tracked

__all__ = ["RMSNorm"]


class RMSNorm(Tracked, nn.Module):
    """The norm over the last dimension with a learned per-feature scale (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        if weight.dim() != 1 or not weight.is_floating_point():
            raise ValueError(f"weight must be a 1-D float tensor, got {tuple(weight.shape)} {weight.dtype}")
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.ops.qbackend.rms_norm(x, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
