"""Building the quantized module for one layer: quantize its weight (the config's weight
observer's scales; GPTQ rounding where the spec carries its input's Hessian), route it to a provider (qbackend.dispatch.route, from its example shape), pack the
weight, and wrap it in the qbackend.nn module for its mode. Used by the graph lowering and by the
module-swap fallback alike (a `LayerSpec` says all it needs)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..config import QuantConfig
from ..dispatch import route
from ..dispatch.batch_routes import BatchRoutes, batch_routes
from ..dispatch.router import KERNEL_PROVIDERS
from ..nn import DynamicQuantizedLinear, QuantizedConv2d, QuantizedLinear, WeightOnlyConv2d, WeightOnlyLinear
from ..nn._weights import quantize_weight
from ..observers import QParams
from ..ops import PackedConv2dWeight, PackedLinearWeight, get_provider
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


@dataclass
class TuneOptions:
    """Tune mode: time each candidate provider on the layer's shapes instead of trusting the rules.

    batch_sizes: the batch sizes to time (None: the example's); the provider with the best
    geometric mean of its time relative to the fastest, over them, wins. cache: a TuneCache
    (None: the default on-disk cache)."""

    batch_sizes: tuple[int, ...] | None = None
    cache: object | None = None


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


# Tune mode keeps the rule table's provider unless another one is faster by more than this: the
# rules are measured on many layers, one layer's timing on a busy machine is noisier than a few
# per cent, and a near-tie costs nothing either way.
TUNE_MARGIN = 1.03


def _tuned(spec: LayerSpec, q, scales, candidates, x_qp, out_qp, accum_qp, options: TuneOptions,
           rule_provider: str | None = None):
    """(provider, why) from timing the candidates (or the cache) at each batch size; the rule's
    provider is kept when it is within TUNE_MARGIN of the fastest."""
    from ..dispatch.tuner import TuneCache, TuneKey, tune

    cache = options.cache if options.cache is not None else TuneCache()
    batches = options.batch_sizes or (spec.x_shape[0],)
    results = []
    for b in batches:
        s = replace(spec, x_shape=(int(b),) + tuple(spec.x_shape[1:]))
        key = TuneKey.make(spec.kind if spec.config.mode == "static" else "linear_dynamic", s.shape_key(),
                           x_bits=(8 if x_qp is not None and _is_8bit(x_qp) else 7) if x_qp is not None else 0,
                           out=str(out_qp.dtype if out_qp is not None else torch.float32).replace("torch.", ""),
                           post_op=spec.post_op, residual=accum_qp is not None)

        def builder(p, s=s):
            module = _module(s, q, scales, p, x_qp, out_qp, accum_qp)
            inputs = _example_inputs(s, module, x_qp, accum_qp)

            def run():
                with torch.no_grad():
                    return module(*inputs)
            return run
        res, hit = tune(key, {p: (lambda p=p: builder(p)) for p in candidates}, cache)
        results.append((b, res, hit))
    scores = {}
    for p in candidates:
        ratios = [r.times_us[p] / min(r.times_us.values()) for _, r, _ in results if p in r.times_us]
        if len(ratios) == len(results):
            scores[p] = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    if not scores:
        raise ValueError(f"{spec.name}: no provider could run it")
    best = min(scores, key=scores.get)
    detail = "; ".join(f"batch {b}: {r.why().removeprefix('tuned: ')}" + (" (cached)" if hit else "")
                       for b, r, hit in results)
    if rule_provider in scores and rule_provider != best and scores[rule_provider] <= scores[best] * TUNE_MARGIN:
        return rule_provider, f"tuned: {detail}; kept the rule's {rule_provider} (within {TUNE_MARGIN:.2f}x)"
    return best, f"tuned: {detail}"


def build_layer(spec: LayerSpec, x_qp: QParams | None = None, out_qp: QParams | None = None,
                accum_qp: QParams | None = None, tune: TuneOptions | None = None) -> tuple[nn.Module, str]:
    """(the quantized module, why its provider was chosen). x_qp is required in static mode.
    With `tune`, the providers are timed on this layer (unless one is forced, by the config or
    QBACKEND_PROVIDER)."""
    mode = spec.config.mode
    w_obs = spec.config.weight.create(f"{spec.name}.weight")
    q, scales = quantize_weight(spec.weight, w_obs, spec.name)
    if spec.hessian is not None and spec.kind == "linear":
        q, spec.rounding = gptq_round(spec.weight, scales, spec.hessian, w_obs.qmin, w_obs.qmax, nearest=q,
                                      factored=spec.hessian_factor)
    if mode == "weight_only":
        if spec.kind == "linear":
            return WeightOnlyLinear(q, scales, spec.bias), "weight-only (FP32 compute)"
        g = spec.geometry
        return WeightOnlyConv2d(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"]), \
            "weight-only (FP32 compute)"
    if mode == "static" and x_qp is None:
        raise ValueError(f"{spec.name}: static quantization needs the input's qparams")
    # dynamic: linear_dynamic picks 7 or 8 bits per provider, so every provider is exact
    eight = mode == "static" and _is_8bit(x_qp)
    kind = spec.kind if mode == "static" else "linear"
    r = route(kind, spec.shape_key(), eight_bit_input=eight, force=spec.config.provider)
    provider, why = r.provider, r.why
    routes = None
    if tune is not None and not r.forced:
        candidates = [p for p in KERNEL_PROVIDERS if (not eight or get_provider(p).exact_8bit())
                      and get_provider(p).refuses(kind, spec.shape_key()) is None]
        if len(candidates) > 1:
            provider, why = _tuned(spec, q, scales, candidates, x_qp, out_qp, accum_qp, tune, r.provider)
    elif not r.forced and spec.config.route_by_batch:
        routes = batch_routes(kind, spec.shape_key(), eight_bit_input=eight)
        if len(routes.providers) > 1:
            why = f"{why}; by batch size: {routes.describe()}"
        else:
            routes = None
    try:
        return _module(spec, q, scales, provider, x_qp, out_qp, accum_qp, routes), why
    except ValueError as exc:  # a geometry this provider refuses (e.g. oneDNN's depthwise bugs)
        if spec.config.provider is not None:
            raise ValueError(f"{spec.name}: the forced provider {spec.config.provider!r} refused it: {exc}") from exc
        other = "fbgemm" if provider == "onednn" else "onednn"
        route(kind, spec.shape_key(), eight, force=other)  # raises if the other one is not exact either
        return (_module(spec, q, scales, other, x_qp, out_qp, accum_qp),
                f"{provider} refused it ({exc}); {other} instead")
