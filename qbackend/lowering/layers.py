"""Building the quantized module for one layer: quantize its weight (the config's weight
observer's scales; GPTQ rounding where the spec carries its input's Hessian, the bias corrected
for the rounding where it carries its input's mean), route it
(qbackend.dispatch.route, from its example shape; tune mode through layer_tuning.py), and build
its module on that provider (layer_modules.py). Used by the graph lowering and by the module-swap
fallback alike (a `LayerSpec` says all it needs)."""
from __future__ import annotations

import dataclasses

from torch import nn

from ..algorithms.gptq import corrected_bias, round_weight
from ..core.routes import Route
from ..dispatch import TuneOptions, noting_seven_bit_weights, route, seven_bit_weights
from ..nn import WeightOnlyConv2d, WeightOnlyLinear
from ..nn.activation import uses_8_bits
from ..nn.weights import SEVEN_BIT_LEVELS, quantize_weight
from ..observers import QParams
from .layer_modules import layer_module
from .layer_spec import LayerSpec
from .layer_tuning import tune_request


def corrects_bias(spec: LayerSpec) -> bool:
    """Whether the layer's bias is corrected for its rounding (QuantConfig.bias_correction; "auto":
    convs, and Linears GPTQ did not round)."""
    setting = spec.config.bias_correction
    if setting == "auto":
        return spec.kind == "conv2d" or (spec.rounding or {}).get("method") != "gptq"
    return bool(setting)


def build_layer(spec: LayerSpec, x_qp: QParams | None = None, out_qp: QParams | None = None,
                accum_qp: QParams | None = None, tune: TuneOptions | None = None) -> tuple[nn.Module, Route | None]:
    """(the quantized module, its route; None for weight-only layers, which compute in float).
    x_qp is required in static mode. With `tune`, the providers are timed on this layer (unless
    one is forced, by the config or QBACKEND_PROVIDER)."""
    mode = spec.config.mode
    token = spec.per_token is not None
    if mode == "static" and x_qp is None and not token:
        raise ValueError(f"{spec.name}: static quantization needs the input's qparams")
    # dynamic: linear_dynamic picks 7 or 8 bits per provider, so every provider is exact; per
    # token: the choice gave 7 bits where no provider is exact on 8 (lowering/per_token.py)
    eight = spec.per_token["qmax"] == 255 if token else mode == "static" and uses_8_bits(x_qp.dtype, x_qp.qmax)
    kind = spec.kind if mode == "static" else "linear"
    # the rules' route, before the weight's bits: a layer the native provider runs may take 7-bit
    # weights (rules.SEVEN_BIT_WEIGHTS); tune mode times layers on their int8 weight, so it keeps 8
    ruled = route(kind, spec.shape_key(), eight_bit_input=eight, forced=spec.config.provider,
                  by_batch=spec.config.route_by_batch) if tune is None and mode != "weight_only" else None
    w_spec, seven = spec.config.weight, None
    if ruled is not None and mode == "static" and not token and spec.config.seven_bit_for_speed \
            and not {"qmin", "qmax", "reduce_range"} & set(w_spec.kwargs):
        seven = seven_bit_weights(kind, spec.shape_key(), ruled)
        if seven is not None:
            qmin, qmax = SEVEN_BIT_LEVELS
            w_spec = dataclasses.replace(w_spec, kwargs={**w_spec.kwargs, "qmin": qmin, "qmax": qmax})
    w_obs = w_spec.create(f"{spec.name}.weight")
    q, scales = quantize_weight(spec.weight, w_obs, spec.name)
    if spec.hessian is not None:
        q, spec.rounding = round_weight(spec.weight, scales, spec.hessian, w_obs.qmin, w_obs.qmax, nearest=q,
                                        factored=spec.hessian_factor)
    if spec.input_mean is not None and mode == "static" and corrects_bias(spec):
        spec.bias = corrected_bias(spec.weight, q, scales, spec.bias, spec.input_mean)
        spec.rounding = {**(spec.rounding or {"method": "nearest"}), "bias_corrected": True}
    if spec.column_order is not None:  # its input's features come in another order (lowering/nhwc_flatten.py)
        q = q[:, spec.column_order].contiguous()
    if mode == "weight_only":
        if spec.kind == "linear":
            return WeightOnlyLinear(q, scales, spec.bias), None
        g = spec.geometry
        return WeightOnlyConv2d(q, scales, spec.bias, g["stride"], g["padding"], g["dilation"], g["groups"]), None
    # tune mode times layers on their int8 input; a per-token layer is routed by the rules
    request = tune_request(spec, tune, q, scales, x_qp, out_qp, accum_qp) if tune is not None and not token else None
    r = ruled if ruled is not None else route(kind, spec.shape_key(), eight_bit_input=eight,
                                              forced=spec.config.provider, by_batch=spec.config.route_by_batch,
                                              tune=request)
    if seven is not None:
        r = noting_seven_bit_weights(r, seven)
    try:
        return layer_module(spec, q, scales, r.provider, x_qp, out_qp, accum_qp, r.batch_routes), r
    except ValueError as exc:  # a geometry the provider refuses only when packing
        if spec.config.provider is not None:
            raise ValueError(f"{spec.name}: the forced provider {spec.config.provider!r} refused it: {exc}") from exc
        other = route(kind, spec.shape_key(), eight_bit_input=eight, exclude=(r.provider,))
        instead = Route(other.provider, other.source, f"{r.provider} refused it ({exc}); {other.provider} instead")
        return layer_module(spec, q, scales, other.provider, x_qp, out_qp, accum_qp), instead
