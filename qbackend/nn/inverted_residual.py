"""QuantizedInvertedResidual: MobileNetV2's inverted-residual block in int8 as one native call.

The block is three QuantizedConv2d layers, kept as its children (`expand`, optional; `depthwise`;
`project`): an optional 1x1 expansion with its activation, a depthwise conv with its activation and
a 1x1 projection, whose residual input (`accum`), when it has one, is the block's input. A call runs
torch.ops.qbackend.native_inverted_residual, which computes the three in tiles of rows so that the
expanded activation never goes to memory, and whose result equals the three layers called in turn
bit for bit. The layers run one after another instead (the same result, three calls) where the
fusion table has no row for this CPU (`fused` False: set when a loaded model is re-routed), when this
call would take a layer off the native provider (a batch size routed elsewhere, a model loaded on a
CPU without the native depthwise kernel), when a layer has its own forward hooks or pre-hooks (so
that `qbackend.compare` and user hooks see every layer), or when an intermediate layer clamps its
output beyond its quantization range (relu6 with a range above 6).
"""
from __future__ import annotations

import torch
from torch import nn

from .conv import QuantizedConv2d


class QuantizedInvertedResidual(nn.Module):
    """expand (optional) -> depthwise -> project [+ accum], each a QuantizedConv2d, in one call."""

    CHAIN = "inverted_residual"  # its row in the fusion table (qbackend.dispatch.rules.FUSIONS)

    def __init__(self, expand: QuantizedConv2d | None, depthwise: QuantizedConv2d, project: QuantizedConv2d):
        super().__init__()
        layers = [m for m in (expand, depthwise, project) if m is not None]
        if not all(isinstance(m, QuantizedConv2d) for m in layers):
            raise TypeError("the layers of a QuantizedInvertedResidual must be QuantizedConv2d modules")
        self.expand, self.depthwise, self.project = expand, depthwise, project
        self.fused = True  # False: always layer by layer (a CPU whose fusion table has no row for the block)

    @property
    def layers(self) -> tuple[QuantizedConv2d, ...]:
        return tuple(m for m in (self.expand, self.depthwise, self.project) if m is not None)

    def _native_forms(self, batch: int):
        """Each layer's native packed weight for this batch size, or None when any layer would run
        elsewhere or must run on its own (see the module docstring)."""
        if not self.fused:
            return None
        forms = []
        for m in self.layers:
            if m._forward_hooks or m._forward_pre_hooks:
                return None
            provider, packed = m.packed._form(batch)
            if provider.name != "native":
                return None
            forms.append(packed)
        if any(m._clamp_max is not None for m in self.layers[:-1]):
            return None
        return forms

    def forward(self, x: torch.Tensor, accum: torch.Tensor | None = None) -> torch.Tensor:
        if (accum is not None) != self.project.has_accum:
            raise ValueError("this QuantizedInvertedResidual was built " + ("with" if self.project.has_accum
                             else "without") + " a residual input (accum)")
        forms = self._native_forms(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() == 4 else None
        if forms is None:
            y = x if self.expand is None else self.expand(x)
            y = self.depthwise(y)
            return self.project(y) if accum is None else self.project(y, accum)
        e, d, p = self.expand, self.depthwise, self.project
        first = e if e is not None else d
        if x.dtype != first.x_dtype:
            raise TypeError(f"x must have dtype {first.x_dtype}, got {x.dtype}")
        *expand_w, dw_w, project_w = forms
        expand_args = ((expand_w[0], e.packed.w_scales, e.packed.bias, e.out_scale, e.out_zero_point, e.out_dtype,
                        e._kernel_post_op) if e is not None else (None, None, None, 1.0, 0, torch.uint8, "none"))
        dp = d.packed
        y = torch.ops.qbackend.native_inverted_residual(
            x, first.x_scale, first.x_zero_point, *expand_args,
            dw_w, dp.w_scales, dp.bias, dp.stride, dp.padding, dp.dilation, d.out_scale, d.out_zero_point,
            d.out_dtype, d._kernel_post_op,
            project_w, p.packed.w_scales, p.packed.bias, p.out_scale, p.out_zero_point, p.out_dtype,
            p._kernel_post_op, accum, p.accum_scale, p.accum_zero_point)
        if p._clamp_max is not None:
            y = torch.clamp_max(y, p._clamp_max)
        return y

    def extra_repr(self) -> str:
        return "fused: one native call when every layer runs on the native provider"
