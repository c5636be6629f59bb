"""Quantized Linear modules.

  QuantizedLinear         static: int8 activations in (uint8/int8 with fixed qparams), uint8/int8
                          (requantized in the kernel's epilogue) or float32 out; relu/gelu fused.
  DynamicQuantizedLinear  float in, float out; the activation is quantized per call over its own range.
  TokenQuantizedLinear    float in, float out; the activation is quantized per call, each row (token)
                          over its own range.
  WeightOnlyLinear        int8 weight in memory (row tiles), float activations (qbackend::woq_linear for float32).
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.generation import Tracked
from ..ops import PackedLinearWeight
from .activation import POST_OPS, StaticQParamsMixin, check_post_op
from .weight_tiles import tile_rows, untile_rows
from .weights import quantize_weight

__all__ = ["POST_OPS", "QuantizedLinear", "DynamicQuantizedLinear", "TokenQuantizedLinear", "WeightOnlyLinear",
           "ACTIVATIONS", "check_activations"]

# The weight-only Linears' activations: "float" (float32 products) or "int8" (quantized per call by blocks).
ACTIVATIONS = ("float", "int8")
_WOQ = torch.ops.qbackend.woq_linear.default
_WOQ_A8 = torch.ops.qbackend.woq_a8_linear.default


def check_activations(activations: str) -> str:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    return activations


class _PackedLinearShape:
    """in_features / out_features / provider of a module around a PackedLinearWeight (`packed`)."""

    @property
    def in_features(self) -> int:
        return self.packed.in_features

    @property
    def out_features(self) -> int:
        return self.packed.out_features

    @property
    def provider(self) -> str:
        return self.packed.provider_name


class QuantizedLinear(_PackedLinearShape, StaticQParamsMixin, nn.Module):
    """y = post_op(dequant(x) @ dequant(W).T + b), output quantized with (out_scale, out_zp) or float32.

    x_nhwc: (C, H*W) where the layer's FP32 input is a [N, C, H, W] value flattened in NCHW order
    and this layer reads it flattened in NHWC order (its weight columns permuted to match: FP32
    column c*H*W + s is column s*C + c here); None where the orders agree."""

    x_nhwc: tuple[int, int] | None = None

    def __init__(self, packed: PackedLinearWeight, x_qparams: tuple[float, int], x_dtype: torch.dtype = torch.uint8,
                 out_qparams: tuple[float, int] | None = None, out_dtype: torch.dtype = torch.float32,
                 post_op: str = "none", out_qmax: int | None = None):
        """out_qmax: the output's largest level when below the dtype's (7-bit activations)."""
        super().__init__()
        self._init_static(packed, x_qparams, x_dtype, out_qparams, out_dtype, post_op, out_qmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.packed.linear(x, self.x_scale, self.x_zero_point, self.out_scale, self.out_zero_point,
                               self.out_dtype, self._kernel_post_op)
        if self._clamp_max is not None:
            y = torch.clamp_max(y, self._clamp_max)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self._qparams_repr()}"


class DynamicQuantizedLinear(Tracked, _PackedLinearShape, nn.Module):
    """Float in, float out: x quantized per call to uint8 over its own range; int8 weight."""

    def __init__(self, packed: PackedLinearWeight, post_op: str = "none"):
        super().__init__()
        self.packed = packed
        self.post_op = check_post_op(post_op)
        if post_op == "relu6":
            raise ValueError("DynamicQuantizedLinear fuses relu and gelu, not relu6")

    @classmethod
    def from_float(cls, linear: nn.Linear, provider: str, weight_observer=None, name: str | None = None,
                   x_shape=None) -> "DynamicQuantizedLinear":
        q, scales = quantize_weight(linear.weight, weight_observer, name)
        return cls(PackedLinearWeight(q, scales, linear.bias, provider=provider, x_shape=x_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"DynamicQuantizedLinear expects float32 input, got {x.dtype}")
        return self.packed.linear_dynamic(x, post_op=self.post_op)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, provider={self.provider}, "
                f"post_op={self.post_op}")


class TokenQuantizedLinear(Tracked, _PackedLinearShape, nn.Module):
    """Float in, float out; the input quantized per token at run time: each row of x to uint8
    over its own range (qbackend::quantize_per_row), multiplied by the int8 weight as with input
    scale 1 and zero point 0, then each row scaled back with its own scale and zero point and the
    bias added (qbackend::per_row_dequantize); relu / gelu after that. For inputs whose outliers
    are whole tokens (a transformer FFN's down projection reading the GELU output), where one
    static range spends most of its levels on the few tokens that need them.

    packed: the int8 weight packed without bias; qmax: 255, or 127 where the provider multiplies
    only 7-bit activations exactly. `colsum` holds (sum_k w[n, k]) * w_scale[n] in float32."""

    def __init__(self, packed: PackedLinearWeight, bias: torch.Tensor | None, qmax: int = 255,
                 post_op: str = "none"):
        super().__init__()
        if packed.bias is not None:
            raise ValueError("TokenQuantizedLinear adds the bias itself: pack the weight without it")
        if qmax not in (255, 127):
            raise ValueError(f"qmax must be 255 or 127, got {qmax!r}")
        self.packed = packed
        self.qmax = int(qmax)
        self.post_op = check_post_op(post_op)
        if post_op == "relu6":
            raise ValueError("TokenQuantizedLinear fuses relu and gelu, not relu6")
        w = packed.weight
        colsum = w.to(torch.int64).sum(dim=1).double() * packed.w_scales.float().double()
        self.register_buffer("colsum", colsum.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"TokenQuantizedLinear expects float32 input, got {x.dtype}")
        q, scale, zero_point = torch.ops.qbackend.quantize_per_row(x, self.qmax)
        acc = self.packed.linear(q, 1.0, 0)
        y = torch.ops.qbackend.per_row_dequantize(acc, scale, zero_point, self.colsum, self.bias)
        if self.post_op == "relu":
            return torch.relu(y)
        if self.post_op == "gelu":
            return torch.nn.functional.gelu(y)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, provider={self.provider}, "
                f"x=uint8 per token (qmax {self.qmax}), post_op={self.post_op}")


class WeightOnlyLinear(Tracked, nn.Module):
    """int8 weight (per-channel scales) kept in memory as row tiles (weight_tiles.py), float
    activations: float32 inputs go to qbackend::woq_linear (the weights streamed as int8, products in
    float32), or with activations="int8" to qbackend::woq_a8_linear (W8A8: the input quantized to int8
    by blocks of 32 features per call, u8 x s8 products in int32); other float dtypes multiply the
    weight dequantized to their dtype."""

    activations = "float"  # the default of instances restored from files written before the choice existed

    def __init__(self, weight: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None,
                 activations: str = "float"):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise TypeError("WeightOnlyLinear needs a 2-D int8 weight")
        self.activations = check_activations(activations)
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.register_buffer("weight_tiles", tile_rows(weight))
        self.register_buffer("w_scales", w_scales.float().reshape(-1, 1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def __setstate__(self, state):
        super().__setstate__(state)
        if "weight_int8" in self._buffers:  # a model written when the weight was stored row-major [N, K]
            weight = self._buffers.pop("weight_int8")
            self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
            self._buffers["weight_tiles"] = tile_rows(weight)

    @property
    def weight_int8(self) -> torch.Tensor:
        """The int8 weight [out_features, in_features] (a copy out of the row tiles)."""
        return untile_rows(self.weight_tiles, self.out_features, self.in_features)

    @classmethod
    def from_float(cls, linear: nn.Linear, weight_observer=None, name: str | None = None,
                   activations: str = "float") -> "WeightOnlyLinear":
        q, scales = quantize_weight(linear.weight, weight_observer, name)
        return cls(q, scales, linear.bias, activations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            op = _WOQ_A8 if self.activations == "int8" else _WOQ
            b = self._buffers  # read directly: nn.Module's attribute lookup costs ~1 us a call when decoding
            return op(x, b["weight_tiles"], b["w_scales"], b["bias"])
        w = self.weight_int8.to(x.dtype) * self.w_scales.to(x.dtype)
        return nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        act = ", activations=int8" if self.activations == "int8" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{act}"
