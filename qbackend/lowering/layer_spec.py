"""What one layer to quantize is (`LayerSpec`): its float weight and bias, example input shape,
config, conv geometry, fused post-op and residual, and its input's calibration statistics (GPTQ's
Hessian, the mean for bias correction); and the shape its route is
read at (`shape_key`). Built by the graph lowering and by the module-swap fallback alike."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import QuantConfig


@dataclass
class LayerSpec:
    """One Linear or Conv2d to quantize (see the module docstring)."""

    kind: str                         # "conv2d" | "linear"
    name: str
    weight: torch.Tensor              # float, [N, K] or [OC, IC/groups, KH, KW]
    bias: torch.Tensor | None
    x_shape: tuple[int, ...]          # the example input's shape
    config: QuantConfig
    geometry: dict = field(default_factory=dict)  # conv2d: stride, padding, dilation, groups (pairs / int)
    post_op: str = "none"
    residual: str | None = None       # conv2d with a fused residual add: its output, "int8" | "float32"
    hessian: torch.Tensor | None = None  # H = X^T X of its input rows (a conv's: im2col), for GPTQ (algorithms/gptq.py)
    hessian_factor: tuple | None = None  # gptq.factor(hessian), when already computed (shared inputs)
    input_mean: torch.Tensor | None = None  # E[x] over the same rows, for bias correction
    rounding: dict | None = None      # set by build_layer: how the weight was rounded (GPTQ's report)
    column_order: torch.Tensor | None = None  # linear: the rounded int8 weight is packed as q[:, column_order]
    per_token: dict | None = None     # a static Linear reading its float input per token: {"qmax", "gain_db"}

    def shape_key(self) -> dict:
        """The shape the dispatch rules look at, with the epilogue flags that change the ranking:
        linear `gelu` (FBGEMM runs GELU unfused, on fp32), conv2d `int8_residual` (FBGEMM adds
        the residual unfused, on fp32; oneDNN fuses it as a sum post-op)."""
        xs, ws = self.x_shape, tuple(self.weight.shape)
        if self.kind == "linear":
            return {"m": rows(xs), "k": ws[1], "n": ws[0], "gelu": int(self.post_op == "gelu")}
        g = self.geometry
        return {"n": xs[0], "c_in": xs[1], "c_out": ws[0], "h": xs[2], "w": xs[3], "kernel": tuple(ws[2:]),
                "stride": tuple(g["stride"]), "padding": tuple(g["padding"]), "groups": g["groups"],
                "int8_residual": int(self.residual == "int8")}


def rows(x_shape) -> int:
    """The rows a Linear multiplies: the product of its input's leading dimensions."""
    m = 1
    for d in x_shape[:-1]:
        m *= d
    return m
