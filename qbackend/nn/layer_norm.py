"""LayerNormQuantize: a transformer block's (residual add +) LayerNorm and the Quantize border
behind it as one qbackend::layer_norm_quantize call, returning (float output, int8 output).

The float output is the LayerNorm's value for its float readers (the next residual add, the
model's output); the int8 output is what the Quantize border gave the next Linears, with the same
qparams (`value` names the activation for requantization on another CPU) and, for SmoothQuant's
post-LN fold, the same per-channel divisors.
"""
from __future__ import annotations

import torch
from torch import nn

from .activation import ActivationBorder, QDTYPES, check_qparams, dtype_top, reduced_qmax

ops = torch.ops.qbackend


class LayerNormQuantize(ActivationBorder, nn.Module):
    """(residual add +) LayerNorm + quantize in one pass: float in, int8 out."""

    def __init__(self, channels: int, eps: float, scale: float, zero_point: int, dtype: torch.dtype = torch.uint8,
                 qmax: int | None = None, value: str | None = None, channel_divisor: torch.Tensor | None = None):
        super().__init__()
        if dtype not in QDTYPES:
            raise TypeError(f"dtype must be uint8 or int8, got {dtype}")
        if channel_divisor is not None and (channel_divisor.dim() != 1 or channel_divisor.numel() != channels):
            raise ValueError(f"channel_divisor must be 1-D with {channels} values")
        self.channels, self.eps, self.dtype, self.value = int(channels), float(eps), dtype, value
        self.register_buffer("channel_divisor", None if channel_divisor is None
                             else channel_divisor.detach().float().contiguous())
        self.register_buffer("_scales", None, persistent=False)
        self.set_qparams(scale, zero_point, qmax)

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        self.scale, self.zero_point = check_qparams(scale, zero_point, self.dtype, "layer_norm_quantize")
        self.qmax = reduced_qmax(qmax, self.dtype)
        d = self.channel_divisor if self.channel_divisor is not None else torch.ones(self.channels)
        self._scales = (d * self.scale).float().contiguous()

    def forward(self, x, residual=None, weight=None, bias=None):
        return ops.layer_norm_quantize(x, residual, weight, bias, self.eps, self._scales, self.zero_point, self.dtype,
                                       self.qmax if self.qmax is not None else dtype_top(self.dtype))

    def extra_repr(self) -> str:
        s = f"{self.channels}, eps={self.eps:g}, {self.value}: {self.dtype}(scale={self.scale:.4g}, zp={self.zero_point})"
        return s + (", SmoothQuant divisors" if self.channel_divisor is not None else "")
