"""Tune mode's side in the lowering: a TuneRequest for one layer, whose bench builds the layer on
a candidate provider and runs it on random activations in its quantized range (the dispatch
layer times the candidates and decides: qbackend.dispatch.tuner)."""
from __future__ import annotations

from dataclasses import replace

import torch

from ..dispatch import TuneOptions, TuneRequest
from ..nn.activation import uses_8_bits
from ..ops.conv import conv2d_output_hw
from .layer_modules import layer_module
from .layer_spec import LayerSpec


def _example_inputs(spec: LayerSpec, x_qp, accum_qp) -> tuple:
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


def tune_request(spec: LayerSpec, options: TuneOptions, q, scales, x_qp, out_qp, accum_qp) -> TuneRequest:
    """Tune mode for this layer: the cache key's parts and a bench that builds it on a provider."""
    def at_batch(b: int) -> LayerSpec:
        return replace(spec, x_shape=(int(b),) + tuple(spec.x_shape[1:]))

    def bench(provider: str, b: int):
        s = at_batch(b)
        module = layer_module(s, q, scales, provider, x_qp, out_qp, accum_qp)
        inputs = _example_inputs(s, x_qp, accum_qp)

        def run():
            with torch.no_grad():
                return module(*inputs)
        return run

    x_bits = (8 if uses_8_bits(x_qp.dtype, x_qp.qmax) else 7) if x_qp is not None else 0
    variant = {"x_bits": x_bits, "out": str(out_qp.dtype if out_qp is not None else torch.float32).replace("torch.", ""),
               "post_op": spec.post_op, "residual": accum_qp is not None}
    return TuneRequest(options, spec.kind if spec.config.mode == "static" else "linear_dynamic", spec.x_shape[0],
                       lambda b: at_batch(b).shape_key(), variant, bench)
