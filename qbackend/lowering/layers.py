"""Building the quantized module for one layer: quantize its weight (the config's weight
observer's scales; GPTQ rounding where the spec carries its input's Hessian), route it to a provider (qbackend.dispatch.route, from its example shape), pack the
weight, and wrap it in the qbackend.nn module for its mode. Used by the graph lowering and by the
module-swap fallback alike (a `LayerSpec` says all it needs)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..config import QuantConfig
from ..core.routes import BatchRoutes, Route
from ..dispatch import TuneOptions, TuneRequest, route
from ..nn import DynamicQuantizedLinear, QuantizedConv2d, QuantizedLinear, WeightOnlyConv2d, WeightOnlyLinear
from ..nn.weights import quantize_weight
from ..observers import QParams
from ..ops import PackedConv2dWeight, PackedLinearWeight
from ..ops.conv import conv2d_output_hw
from .gptq import gptq_round


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
    residual: str | None = None       # conv2d with a fused residual add: its output, "int8" | "float32"
    hessian: torch.Tensor | None = None  # linear: H = X^T X of its input, for GPTQ rounding (lowering/gptq.py)
    hessian_factor: tuple | None = None  # gptq.factor(hessian), when already computed (shared inputs)
    rounding: dict | None = None      # set by build_layer: how the weight was rounded (GPTQ's report)

    def shape_key(self) -> dict:
        """The shape the dispatch rules look at, with the epilogue flags that change the ranking:
        linear `gelu` (FBGEMM runs GELU unfused, on fp32), conv2d `int8_residual` (FBGEMM adds
        the residual unfused, on fp32; oneDNN fuses it as a sum post-op)."""
        xs, ws = self.x_shape, tuple(self.weight.shape)
        if self.kind == "linear":
            m = 1
            for d in xs[:-1]:
                m *= d
            return {"m": m, "k": ws[1], "n": ws[0], "gelu": int(self.post_op == "gelu")}
        g = self.geometry
        return {"n": xs[0], "c_in": xs[1], "c_out": ws[0], "h": xs[2], "w": xs[3], "kernel": tuple(ws[2:]),
                "stride": tuple(g["stride"]), "padding": tuple(g["padding"]), "groups": g["groups"],
                "int8_residual": int(self.residual == "int8")}


def _is_8bit(qp: QParams) -> bool:
    """Whether activations with these qparams use the full 8-bit range (not the 7-bit one).
    rebind._is_8bit_input answers the same for a converted layer, from the activation table."""
    return qp.dtype == torch.int8 or qp.qmax > 127


def _pack(spec: LayerSpec, q: torch.Tensor, scales: torch.Tensor, provider: str, x_qparams,
          routes: BatchRoutes | None = None):
    if spec.kind == "linear":
        m = 1
        for d in spec.x_shape[:-1]:
            m *= d
        return PackedLinearWeight(q, scales, spec.bias, provider=provider, x_shape=[m, spec.x_shape[-1]],
                                  batch_routes=routes)
    g = spec.geometry
    return PackedConv2dWeight(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"],
                              provider=provider, x_shape=list(spec.x_shape), x_qparams=x_qparams,
                              batch_routes=routes)


def _module(spec: LayerSpec, q, scales, provider: str, x_qp: QParams | None, out_qp: QParams | None,
            accum_qp: QParams | None, routes: BatchRoutes | None = None) -> nn.Module:
    """The quantized module of spec on `provider` (and, with `routes`, on each provider of its batch
    routes; packing may raise ValueError for a geometry the provider refuses)."""
    if spec.config.mode == "dynamic":
        return DynamicQuantizedLinear(_pack(spec, q, scales, provider, None, routes), post_op=spec.post_op)
    x_qparams = (float(x_qp.scale), int(x_qp.zero_point))
    packed = _pack(spec, q, scales, provider, x_qparams, routes)
    out_dtype = out_qp.dtype if out_qp is not None else torch.float32
    out_qparams = (float(out_qp.scale), int(out_qp.zero_point)) if out_qp is not None else None
    out_qmax = out_qp.qmax if out_qp is not None else None
    if spec.kind == "linear":
        return QuantizedLinear(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op, out_qmax=out_qmax)
    accum = (float(accum_qp.scale), int(accum_qp.zero_point)) if accum_qp is not None else None
    return QuantizedConv2d(packed, x_qparams, x_qp.dtype, out_qparams, out_dtype, spec.post_op, accum,
                           accum_qp.dtype if accum_qp is not None else torch.uint8, out_qmax=out_qmax)


def _example_inputs(spec: LayerSpec, module: nn.Module, x_qp, accum_qp) -> tuple:
    """Representative inputs for timing: random activations in the layer's quantized range."""
    g = torch.Generator().manual_seed(0)
    if spec.config.mode == "dynamic":
        return (torch.randn(spec.x_shape, generator=g),)
    lo, hi = x_qp.qmin, x_qp.qmax
    x = torch.randint(lo, hi + 1, spec.x_shape, generator=g).to(x_qp.dtype)
    if spec.kind == "conv2d":
        x = x.contiguous(memory_format=torch.channels_last)
    if accum_qp is None:
        return (x,)
    geo = spec.geometry
    oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], tuple(spec.weight.shape[2:]), geo["stride"], geo["padding"],
                              geo["dilation"])
    shape = (x.shape[0], spec.weight.shape[0], oh, ow)
    acc = torch.randint(accum_qp.qmin, accum_qp.qmax + 1, shape, generator=g).to(accum_qp.dtype)
    return x, acc.contiguous(memory_format=torch.channels_last)


WEIGHT_ONLY_WHY = "weight-only (FP32 compute)"


def route_text(r: Route | None) -> str:
    """A layer's why: its route's, or that it computes in float (weight-only)."""
    return WEIGHT_ONLY_WHY if r is None else r.describe()


def _tune_request(spec: LayerSpec, options: TuneOptions, q, scales, x_qp, out_qp, accum_qp) -> TuneRequest:
    """Tune mode for this layer: the cache key's parts and a bench that builds it on a provider."""
    def at_batch(b: int) -> LayerSpec:
        return replace(spec, x_shape=(int(b),) + tuple(spec.x_shape[1:]))

    def bench(provider: str, b: int):
        s = at_batch(b)
        module = _module(s, q, scales, provider, x_qp, out_qp, accum_qp)
        inputs = _example_inputs(s, module, x_qp, accum_qp)

        def run():
            with torch.no_grad():
                return module(*inputs)
        return run

    x_bits = (8 if _is_8bit(x_qp) else 7) if x_qp is not None else 0
    variant = {"x_bits": x_bits, "out": str(out_qp.dtype if out_qp is not None else torch.float32).replace("torch.", ""),
               "post_op": spec.post_op, "residual": accum_qp is not None}
    return TuneRequest(options, spec.kind if spec.config.mode == "static" else "linear_dynamic", spec.x_shape[0],
                       lambda b: at_batch(b).shape_key(), variant, bench)


def build_layer(spec: LayerSpec, x_qp: QParams | None = None, out_qp: QParams | None = None,
                accum_qp: QParams | None = None, tune: TuneOptions | None = None) -> tuple[nn.Module, Route | None]:
    """(the quantized module, its route; None for weight-only layers, which compute in float).
    x_qp is required in static mode. With `tune`, the providers are timed on this layer (unless
    one is forced, by the config or QBACKEND_PROVIDER)."""
    mode = spec.config.mode
    w_obs = spec.config.weight.create(f"{spec.name}.weight")
    q, scales = quantize_weight(spec.weight, w_obs, spec.name)
    if spec.hessian is not None and spec.kind == "linear":
        q, spec.rounding = gptq_round(spec.weight, scales, spec.hessian, w_obs.qmin, w_obs.qmax, nearest=q,
                                      factored=spec.hessian_factor)
    if mode == "weight_only":
        if spec.kind == "linear":
            return WeightOnlyLinear(q, scales, spec.bias), None
        g = spec.geometry
        return WeightOnlyConv2d(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"]), None
    if mode == "static" and x_qp is None:
        raise ValueError(f"{spec.name}: static quantization needs the input's qparams")
    # dynamic: linear_dynamic picks 7 or 8 bits per provider, so every provider is exact
    eight = mode == "static" and _is_8bit(x_qp)
    kind = spec.kind if mode == "static" else "linear"
    request = _tune_request(spec, tune, q, scales, x_qp, out_qp, accum_qp) if tune is not None else None
    r = route(kind, spec.shape_key(), eight_bit_input=eight, forced=spec.config.provider,
              by_batch=spec.config.route_by_batch, tune=request)
    try:
        return _module(spec, q, scales, r.provider, x_qp, out_qp, accum_qp, r.batch_routes), r
    except ValueError as exc:  # a geometry the provider refuses only when packing
        if spec.config.provider is not None:
            raise ValueError(f"{spec.name}: the forced provider {spec.config.provider!r} refused it: {exc}") from exc
        other = route(kind, spec.shape_key(), eight_bit_input=eight, exclude=(r.provider,))
        instead = Route(other.provider, other.source, f"{r.provider} refused it ({exc}); {other.provider} instead")
        return _module(spec, q, scales, other.provider, x_qp, out_qp, accum_qp), instead
