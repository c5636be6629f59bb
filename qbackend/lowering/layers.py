"""Building the quantized module for one layer: quantize its weight (the config's weight
observer), route it to a provider (qbackend.dispatch.route, from its example shape), pack the
weight, and wrap it in the qbackend.nn module for its mode. Used by the graph lowering and by the
module-swap fallback alike (a `LayerSpec` says all it needs)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import QuantConfig
from ..dispatch import route
from ..nn import DynamicQuantizedLinear, QuantizedConv2d, QuantizedLinear, WeightOnlyConv2d, WeightOnlyLinear
from ..nn._weights import quantize_weight
from ..observers import QParams
from ..ops import PackedConv2dWeight, PackedLinearWeight


@dataclass
class LayerSpec:
    kind: str                         # "conv2d" | "linear"
    name: str
    weight: torch.Tensor              # float, [N, K] or [OC, IC/groups, KH, KW]
    bias: torch.Tensor | None
    x_shape: tuple[int, ...]          # the example input's shape
    config: QuantConfig
    geometry: dict = field(default_factory=dict)  # conv2d: stride, padding, dilation, groups (pairs / int)
    post_op: str = "none"

    def shape_key(self) -> dict:
        """The shape the dispatch rules look at."""
        xs, ws = self.x_shape, tuple(self.weight.shape)
        if self.kind == "linear":
            m = 1
            for d in xs[:-1]:
                m *= d
            return {"m": m, "k": ws[1], "n": ws[0]}
        g = self.geometry
        return {"n": xs[0], "c_in": xs[1], "c_out": ws[0], "h": xs[2], "w": xs[3], "kernel": tuple(ws[2:]),
                "stride": tuple(g["stride"]), "groups": g["groups"]}


def _is_8bit(qp: QParams) -> bool:
    return qp.dtype == torch.int8 or qp.qmax > 127


def _pack(spec: LayerSpec, q: torch.Tensor, scales: torch.Tensor, provider: str, x_qparams):
    if spec.kind == "linear":
        m = 1
        for d in spec.x_shape[:-1]:
            m *= d
        return PackedLinearWeight(q, scales, spec.bias, provider=provider, x_shape=[m, spec.x_shape[-1]])
    g = spec.geometry
    return PackedConv2dWeight(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"],
                              provider=provider, x_shape=list(spec.x_shape), x_qparams=x_qparams)


def build_layer(spec: LayerSpec, x_qp: QParams | None = None, out_qp: QParams | None = None,
                accum_qp: QParams | None = None) -> tuple[nn.Module, str]:
    """(the quantized module, why its provider was chosen). x_qp is required in static mode."""
    mode = spec.config.mode
    w_obs = spec.config.weight.create(f"{spec.name}.weight")
    q, scales = quantize_weight(spec.weight, w_obs, spec.name)
    if mode == "weight_only":
        if spec.kind == "linear":
            return WeightOnlyLinear(q, scales, spec.bias), "weight-only (FP32 compute)"
        g = spec.geometry
        return WeightOnlyConv2d(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"]), \
            "weight-only (FP32 compute)"
    if mode == "dynamic":
        r = route("linear", spec.shape_key(), eight_bit_input=False,  # linear_dynamic picks 7/8 bits per provider
                  force=spec.config.provider)
        return DynamicQuantizedLinear(_pack(spec, q, scales, r.provider, None), post_op=spec.post_op), r.why
    if x_qp is None:
        raise ValueError(f"{spec.name}: static quantization needs the input's qparams")
    eight = _is_8bit(x_qp)
    r = route(spec.kind, spec.shape_key(), eight_bit_input=eight, force=spec.config.provider)
    x_qparams = (float(x_qp.scale), int(x_qp.zero_point))
    try:
        packed, why = _pack(spec, q, scales, r.provider, x_qparams), r.why
    except ValueError as exc:  # a geometry this provider refuses (e.g. oneDNN's depthwise bugs)
        if spec.config.provider is not None:
            raise ValueError(f"{spec.name}: the forced provider {spec.config.provider!r} refused it: {exc}") from exc
        other = "fbgemm" if r.provider == "onednn" else "onednn"
        route(spec.kind, spec.shape_key(), eight, force=other)  # raises if the other one is not exact either
        packed, why = _pack(spec, q, scales, other, x_qparams), f"{r.provider} refused it ({exc}); {other} instead"
    out_dtype = out_qp.dtype if out_qp is not None else torch.float32
    out_qparams = (float(out_qp.scale), int(out_qp.zero_point)) if out_qp is not None else None
    if spec.kind == "linear":
        return QuantizedLinear(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op,
                               out_qmax=out_qp.qmax if out_qp is not None else None), why
    accum = (float(accum_qp.scale), int(accum_qp.zero_point)) if accum_qp is not None else None
    return QuantizedConv2d(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op, accum,
                           accum_qp.dtype if accum_qp is not None else torch.uint8,
                           out_qmax=out_qp.qmax if out_qp is not None else None), why
