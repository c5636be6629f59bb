"""GlobalAvgPoolQuantize: a global average pool (adaptive_avg_pool2d to 1 x 1) between an int8 value
and the Quantize border behind it, as one qbackend::global_avg_pool2d call: int8 in (the qparams of
the layer output it reads), int8 out (the qparams the Quantize border gave the next layer). The
classifier heads of CNNs (pool -> flatten -> Linear) then stay in int8 from the last conv on.
"""
from __future__ import annotations

import torch
from torch import nn

from .activation import ActivationBorder, QDTYPES, check_qparams, reduced_qmax

ops = torch.ops.qbackend


class GlobalAvgPoolQuantize(ActivationBorder, nn.Module):
    """int8 [N, C, H, W] -> int8 [N, C, 1, 1]: the mean over H x W, requantized.

    `value` names the output activation (its qparams: `set_qparams`), `x_value` the input one
    (`set_input_qparams`); both are updated when a loaded model is requantized for another CPU."""

    def __init__(self, x_scale: float, x_zero_point: int, x_dtype: torch.dtype, scale: float, zero_point: int,
                 dtype: torch.dtype = torch.uint8, qmax: int | None = None, value: str | None = None,
                 x_value: str | None = None):
        super().__init__()
        for what, dt in (("x_dtype", x_dtype), ("dtype", dtype)):
            if dt not in QDTYPES:
                raise TypeError(f"{what} must be uint8 or int8, got {dt}")
        self.x_dtype, self.dtype, self.value, self.x_value = x_dtype, dtype, value, x_value
        self.set_input_qparams(x_scale, x_zero_point)
        self.set_qparams(scale, zero_point, qmax)

    def set_input_qparams(self, scale: float, zero_point: int) -> None:
        self.x_scale, self.x_zero_point = check_qparams(scale, zero_point, self.x_dtype, "global_avg_pool input")

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        self.scale, self.zero_point = check_qparams(scale, zero_point, self.dtype, "global_avg_pool output")
        self.qmax = reduced_qmax(qmax, self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ops.global_avg_pool2d(x, self.x_scale, self.x_zero_point, self.scale, self.zero_point, self.dtype)
        if self.qmax is not None:
            y = torch.clamp_max(y, self.qmax)
        return y

    def extra_repr(self) -> str:
        s = (f"{self.x_value}: {self.x_dtype}(scale={self.x_scale:.4g}, zp={self.x_zero_point}) -> "
             f"{self.value}: {self.dtype}(scale={self.scale:.4g}, zp={self.zero_point})")
        return s + (f", qmax={self.qmax}" if self.qmax is not None else "")
