"""Quantized Conv2d modules.

  QuantizedConv2d   static: int8 activations in, uint8/int8 (requantized in the epilogue) or float32
                    out, channels-last; relu/relu6/gelu fused, and an optional residual input
                    (`accum`, int8 with its own qparams) added before the activation.
  WeightOnlyConv2d  int8 weight in memory, float compute.
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.generation import Tracked
from ..ops import PackedConv2dWeight
from .activation import QDTYPES, StaticQParamsMixin, check_qparams
from .weights import quantize_weight


class QuantizedConv2d(StaticQParamsMixin, nn.Module):
    """y = post_op(conv(dequant(x), dequant(W)) + b [+ dequant(accum)]), quantized with out qparams or float32.

    accum_donated: nothing reads the residual input after this call (the lowering sets it where that
    holds), so providers that can write the result into it do, without copying it first."""

    accum_donated: bool = False

    def __init__(self, packed: PackedConv2dWeight, x_qparams: tuple[float, int], x_dtype: torch.dtype = torch.uint8,
                 out_qparams: tuple[float, int] | None = None, out_dtype: torch.dtype = torch.float32,
                 post_op: str = "none", accum_qparams: tuple[float, int] | None = None,
                 accum_dtype: torch.dtype = torch.uint8, out_qmax: int | None = None):
        """out_qmax: the output's largest level when below the dtype's (7-bit activations)."""
        super().__init__()
        if accum_dtype not in QDTYPES:
            raise TypeError(f"accum_dtype must be uint8 or int8, got {accum_dtype}")
        self._init_static(packed, x_qparams, x_dtype, out_qparams, out_dtype, post_op, out_qmax)
        self.has_accum = accum_qparams is not None
        self.accum_dtype = accum_dtype
        self.accum_scale, self.accum_zero_point = (check_qparams(*accum_qparams, accum_dtype, "accum")
                                                   if self.has_accum else (1.0, 0))

    def forward(self, x: torch.Tensor, accum: torch.Tensor | None = None) -> torch.Tensor:
        if (accum is not None) != self.has_accum:
            raise ValueError("this QuantizedConv2d was built " + ("with" if self.has_accum else "without")
                             + " a residual input (accum)")
        # donated residuals are written in place in eager mode only: under torch.compile the
        # mutating op's auto-functionalization fails in Inductor's freezing pass (mkldnn weights)
        if accum is not None and self.accum_donated and not torch.compiler.is_compiling():
            y = self.packed.conv2d_add_(x, self.x_scale, self.x_zero_point, self.out_scale, self.out_zero_point,
                                        self.out_dtype, self._kernel_post_op, accum, self.accum_scale,
                                        self.accum_zero_point)
        else:
            y = self.packed.conv2d(x, self.x_scale, self.x_zero_point, self.out_scale, self.out_zero_point,
                                   self.out_dtype, self._kernel_post_op, accum, self.accum_scale,
                                   self.accum_zero_point)
        if self._clamp_max is not None:
            y = torch.clamp_max(y, self._clamp_max)
        return y

    def extra_repr(self) -> str:
        p = self.packed
        s = (f"{p.in_channels}, {p.out_channels}, kernel_size={p.kernel_size}, stride={tuple(p.stride)}, "
             f"padding={tuple(p.padding)}, groups={p.groups}, {self._qparams_repr()}")
        if self.has_accum:
            s += f", accum={self.accum_dtype}(scale={self.accum_scale:.4g}, zp={self.accum_zero_point})"
        return s


class WeightOnlyConv2d(Tracked, nn.Module):
    """int8 conv weight (per-channel scales) kept in memory; dequantized to float for each call."""

    def __init__(self, weight: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None, stride, padding,
                 dilation, groups: int):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 4:
            raise TypeError("WeightOnlyConv2d needs a 4-D int8 weight")
        self.register_buffer("weight_int8", weight.contiguous())
        self.register_buffer("w_scales", w_scales.float().reshape(-1, 1, 1, 1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    @classmethod
    def from_float(cls, conv: nn.Conv2d, weight_observer=None, name: str | None = None) -> "WeightOnlyConv2d":
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(f"{name or 'conv'}: only zero padding given as numbers is supported")
        q, scales = quantize_weight(conv.weight, weight_observer, name)
        return cls(q, scales, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_int8.to(x.dtype) * self.w_scales.to(x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return nn.functional.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups)
