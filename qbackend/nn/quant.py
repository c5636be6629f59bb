"""Quantize / Dequantize as modules: the borders of the int8 regions of a converted model.

Each names the activation value whose qparams it uses (`value`, a key of the model's activation
table), so a loaded model can be requantized for another CPU (7-bit activations where the CPU
has no VNNI) by updating modules, not graph constants.
"""
from __future__ import annotations

import torch
from torch import nn

from ._activation import QDTYPES, check_qparams

ops = torch.ops.qbackend


class Quantize(nn.Module):
    """float -> uint8/int8 with (scale, zero_point), saturating at qmax (7-bit activations: 127)."""

    def __init__(self, scale: float, zero_point: int, dtype: torch.dtype = torch.uint8, qmax: int | None = None,
                 value: str | None = None):
        super().__init__()
        if dtype not in QDTYPES:
            raise TypeError(f"dtype must be uint8 or int8, got {dtype}")
        self.dtype, self.value = dtype, value
        self.set_qparams(scale, zero_point, qmax)

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        self.scale, self.zero_point = check_qparams(scale, zero_point, self.dtype, "quantize")
        top = 255 if self.dtype == torch.uint8 else 127
        self.qmax = qmax if qmax is not None and qmax < top else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = ops.quantize_per_tensor(x, self.scale, self.zero_point, self.dtype)
        if self.qmax is not None:
            q = torch.clamp_max(q, self.qmax)
        return q

    def extra_repr(self) -> str:
        s = f"{self.value}: {self.dtype}(scale={self.scale:.4g}, zp={self.zero_point})"
        return s + (f", qmax={self.qmax}" if self.qmax is not None else "")


class Dequantize(nn.Module):
    """uint8/int8 -> float32 with (scale, zero_point)."""

    def __init__(self, scale: float, zero_point: int, dtype: torch.dtype = torch.uint8, value: str | None = None):
        super().__init__()
        self.dtype, self.value = dtype, value
        self.set_qparams(scale, zero_point)

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        self.scale, self.zero_point = check_qparams(scale, zero_point, self.dtype, "dequantize")

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return ops.dequantize_per_tensor(q, self.scale, self.zero_point)

    def extra_repr(self) -> str:
        return f"{self.value}: {self.dtype}(scale={self.scale:.4g}, zp={self.zero_point})"
