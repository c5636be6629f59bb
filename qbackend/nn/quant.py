"""Quantize / Dequantize as modules: the borders of the int8 regions of a converted model.

Each names the activation value whose qparams it uses (`value`, a key of the model's activation
table), so a loaded model can be requantized for another CPU (7-bit activations where it has no
exact route for 8-bit ones) by updating modules, not graph constants.
"""
from __future__ import annotations

import torch
from torch import nn

from .activation import ActivationBorder, QDTYPES, check_qparams, reduced_qmax

ops = torch.ops.qbackend


class Quantize(ActivationBorder, nn.Module):
    """float -> uint8/int8 with (scale, zero_point), saturating at qmax (7-bit activations: 127).

    With `channel_divisor` d (float32 [C], SmoothQuant's factors), channel c of the last dimension
    is divided by d[c] first: one per-channel quantize with scales scale * d, as fast as per
    tensor.

    `channels_last` (set by the lowering where every reader is a conv): a 4-D input is quantized
    into a channels-last output directly, the layout the conv kernels read (a channels-first
    image otherwise costs the conv a layout copy of its int8 input)."""

    channels_last: bool = False

    def __init__(self, scale: float, zero_point: int, dtype: torch.dtype = torch.uint8, qmax: int | None = None,
                 value: str | None = None, channel_divisor: torch.Tensor | None = None):
        super().__init__()
        if dtype not in QDTYPES:
            raise TypeError(f"dtype must be uint8 or int8, got {dtype}")
        if channel_divisor is not None:
            d = channel_divisor
            if not isinstance(d, torch.Tensor) or d.dim() != 1 or d.numel() == 0 or not d.is_floating_point() \
                    or not bool(torch.isfinite(d).all()) or not bool((d > 0).all()):
                raise ValueError("channel_divisor must be a non-empty 1-D float tensor of finite positive values")
            channel_divisor = d.detach().float().contiguous()
        self.dtype, self.value = dtype, value
        self.register_buffer("channel_divisor", channel_divisor)
        self.register_buffer("_channel_scales", None, persistent=False)
        self.register_buffer("_channel_zps", None, persistent=False)
        self.set_qparams(scale, zero_point, qmax)

    def __setstate__(self, state):  # models saved before channel_divisor existed
        super().__setstate__(state)
        for name in ("channel_divisor", "_channel_scales", "_channel_zps"):
            if name not in self._buffers:
                self._buffers[name] = None

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        self.scale, self.zero_point = check_qparams(scale, zero_point, self.dtype, "quantize")
        self.qmax = reduced_qmax(qmax, self.dtype)
        if self.channel_divisor is not None:
            self._channel_scales = self.channel_divisor * self.scale
            self._channel_zps = torch.full_like(self.channel_divisor, self.zero_point, dtype=torch.int32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_divisor is not None:
            q = ops.quantize_per_channel(x, self._channel_scales, self._channel_zps, x.dim() - 1, self.dtype)
        elif self.channels_last and x.dim() == 4:
            q = ops.quantize_per_tensor(x, self.scale, self.zero_point, self.dtype, torch.channels_last)
        else:
            q = ops.quantize_per_tensor(x, self.scale, self.zero_point, self.dtype)
        if self.qmax is not None:
            q = torch.clamp_max(q, self.qmax)
        return q

    def extra_repr(self) -> str:
        s = f"{self.value}: {self.dtype}(scale={self.scale:.4g}, zp={self.zero_point})"
        s += f", qmax={self.qmax}" if self.qmax is not None else ""
        s += ", channels-last output" if self.channels_last else ""
        return s + (f", channels divided by SmoothQuant factors [{self.channel_divisor.numel()}]"
                    if self.channel_divisor is not None else "")


class Dequantize(ActivationBorder, nn.Module):
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
