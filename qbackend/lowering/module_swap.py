"""The fallback when the model cannot be captured as a graph: swap its supported modules one by
one, in a copy of the model (parameters shared with the user's model, never modified).

Static mode: each nn.Linear / nn.Conv2d gets an input observer; at convert it becomes
quantize -> int8 kernel -> float32 output (`FloatBoundary`), so activations are int8 only inside
each layer: no fusion, no BatchNorm folding, no int8 between layers (slower and a little less
accurate than the graph path; the warning that announces the fallback says so).
Dynamic / weight-only modes: nn.Linear (and nn.LSTM for dynamic) become their qbackend.nn
module; this is also how `quantize_dynamic` works (no capture needed).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..config import QuantConfig
from ..observers import Observer
from .layers import LayerSpec, build_layer

ops_ns = torch.ops.qbackend
ASSUMED_M = 64  # the rows routing assumes for a dynamic Linear whose input was never seen


class ObservedLayer(nn.Module):
    """A float module with an observer on its input (and the input's shape remembered for routing)."""

    def __init__(self, module: nn.Module, observer: Observer | None):
        super().__init__()
        self.module = module
        self.observer = observer
        self.x_shape: tuple[int, ...] | None = None

    def forward(self, x, *args, **kwargs):
        if isinstance(x, torch.Tensor):
            if self.x_shape is None:
                self.x_shape = tuple(x.shape)
            if self.observer is not None:
                self.observer.update(x.detach())
        return self.module(x, *args, **kwargs)


class FloatBoundary(nn.Module):
    """float32 in -> quantize -> a static int8 layer with float32 output."""

    def __init__(self, layer: nn.Module, x_qmax: int | None = None):
        """x_qmax: the input's largest level when below the dtype's (7-bit activations)."""
        super().__init__()
        self.layer = layer
        self.x_qmax = x_qmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = ops_ns.quantize_per_tensor(x, self.layer.x_scale, self.layer.x_zero_point, self.layer.x_dtype)
        if self.x_qmax is not None:
            xq = torch.clamp_max(xq, self.x_qmax)
        return self.layer(xq)


class SwappedModel:
    def __init__(self, model: nn.Module, config: QuantConfig, layers: dict[str, ObservedLayer], skipped: list):
        self.model, self.config, self.layers, self.skipped = model, config, layers, skipped

    def observers(self) -> dict[str, Observer]:
        return {w.observer.name: w.observer for w in self.layers.values() if w.observer is not None}


def _supported(module: nn.Module, cfg: QuantConfig) -> str | None:
    """Why the module cannot be swapped in this mode (None if it can)."""
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.Conv2d):
        if cfg.mode == "dynamic":
            return "dynamic quantization applies to Linear layers only"
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            return "only zero padding given as numbers is supported"
        return None
    if isinstance(module, nn.LSTM):
        return None if cfg.mode == "dynamic" else "LSTM is quantized in dynamic mode only"
    return "unsupported"


def swap_modules(model: nn.Module, example_args: tuple | None, example_kwargs: dict | None,
                 config: QuantConfig) -> SwappedModel:
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    copy_ = copy.deepcopy(model, memo)
    layers, skipped = {}, []
    for name, module in list(copy_.named_modules()):
        if not isinstance(module, (nn.Linear, nn.Conv2d, nn.LSTM)) or not name:
            continue
        cfg = config.for_module(name, module)
        if cfg is None:
            continue
        why = _supported(module, cfg)
        if why is not None:
            if why != "unsupported":
                skipped.append((name, why))
            continue
        observer = cfg.activation.create(f"{name}.input") if cfg.mode == "static" else None
        wrapper = ObservedLayer(module, observer)
        wrapper.config = cfg
        copy_.set_submodule(name, wrapper)
        layers[name] = wrapper
    if example_args is not None:  # one pass to learn the shapes (the observers forget it)
        with torch.no_grad():
            copy_(*example_args, **(example_kwargs or {}))
        for w in layers.values():
            if w.observer is not None:
                w.observer.reset()
    return SwappedModel(copy_, config, layers, skipped)


def _spec(name: str, wrapper: ObservedLayer) -> LayerSpec:
    m = wrapper.module
    if isinstance(m, nn.Linear):
        x_shape = wrapper.x_shape or (ASSUMED_M, m.in_features)
        return LayerSpec("linear", name, m.weight, m.bias, tuple(x_shape), wrapper.config)
    if wrapper.x_shape is None:
        raise ValueError(f"{name}: this layer never ran during calibration (no input shape, no ranges)")
    geometry = {"stride": list(m.stride), "padding": list(m.padding), "dilation": list(m.dilation),
                "groups": m.groups}
    return LayerSpec("conv2d", name, m.weight, m.bias, tuple(wrapper.x_shape), wrapper.config, geometry)


def convert_swapped(swapped: SwappedModel) -> nn.Module:
    model = swapped.model
    info = {}
    for name, wrapper in swapped.layers.items():
        cfg = wrapper.config
        if isinstance(wrapper.module, nn.LSTM):
            from ..nn.lstm import DynamicQuantizedLSTM

            new = DynamicQuantizedLSTM.from_float(wrapper.module, weight_observer=cfg.weight.create(),
                                                  example_shape=wrapper.x_shape)
            why = "dynamic LSTM (providers: " + ", ".join(f"{k} {v}" for k, v in new.providers.items()) + ")"
        else:
            x_qp = wrapper.observer.compute_qparams() if wrapper.observer is not None else None
            layer, why = build_layer(_spec(name, wrapper), x_qp)
            if cfg.mode == "static":
                new = FloatBoundary(layer, x_qp.qmax if x_qp.qmax < (255 if x_qp.dtype == torch.uint8 else 127)
                                    else None)
            else:
                new = layer
        info[name] = {"kind": type(wrapper.module).__name__.lower(), "mode": cfg.mode, "module": name, "why": why,
                      "post_op": "none", "residual": False, "output": "float32"}
        model.set_submodule(name, new)
    model.qbackend_layers = info
    return model
