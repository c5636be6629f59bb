"""The qbackend.nn module of one layer on a given provider: its weight packed for the provider
(and for each provider of its batch routes), wrapped in the module for its mode with the
activation qparams it runs with."""
from __future__ import annotations

import torch
from torch import nn

from ..core.routes import BatchRoutes
from ..nn import DynamicQuantizedLinear, QuantizedConv2d, QuantizedLinear, TokenQuantizedLinear
from ..observers import QParams
from ..ops import PackedConv2dWeight, PackedLinearWeight
from .layer_spec import LayerSpec, rows


def pack(spec: LayerSpec, q: torch.Tensor, scales: torch.Tensor, provider: str, x_qparams,
          routes: BatchRoutes | None = None):
    if spec.kind == "linear":
        return PackedLinearWeight(q, scales, spec.bias, provider=provider, x_shape=[rows(spec.x_shape), spec.x_shape[-1]],
                                  batch_routes=routes)
    g = spec.geometry
    return PackedConv2dWeight(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"],
                              provider=provider, x_shape=list(spec.x_shape), x_qparams=x_qparams,
                              batch_routes=routes)


def layer_module(spec: LayerSpec, q, scales, provider: str, x_qp: QParams | None, out_qp: QParams | None,
            accum_qp: QParams | None, routes: BatchRoutes | None = None) -> nn.Module:
    """The quantized module of spec on `provider` (and, with `routes`, on each provider of its batch
    routes; packing may raise ValueError for a geometry the provider refuses)."""
    if spec.per_token is not None:
        packed = PackedLinearWeight(q, scales, None, provider=provider, x_shape=[rows(spec.x_shape), spec.x_shape[-1]],
                                    batch_routes=routes)
        return TokenQuantizedLinear(packed, spec.bias, spec.per_token["qmax"], spec.post_op)
    if spec.config.mode == "dynamic":
        return DynamicQuantizedLinear(pack(spec, q, scales, provider, None, routes), post_op=spec.post_op)
    x_qparams = (float(x_qp.scale), int(x_qp.zero_point))
    packed = pack(spec, q, scales, provider, x_qparams, routes)
    out_dtype = out_qp.dtype if out_qp is not None else torch.float32
    out_qparams = (float(out_qp.scale), int(out_qp.zero_point)) if out_qp is not None else None
    out_qmax = out_qp.qmax if out_qp is not None else None
    if spec.kind == "linear":
        return QuantizedLinear(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op, out_qmax=out_qmax)
    accum = (float(accum_qp.scale), int(accum_qp.zero_point)) if accum_qp is not None else None
    return QuantizedConv2d(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op, accum,
                           accum_qp.dtype if accum_qp is not None else torch.uint8, out_qmax=out_qmax)
