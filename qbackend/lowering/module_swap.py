"""The fallback when the model cannot be captured as a graph: swap its supported modules one by
one, in a copy of the model (parameters shared with the user's model, never modified).

Static mode: each nn.Linear / nn.Conv2d gets an input observer; at convert it becomes
quantize -> int8 kernel -> float32 output (`FloatBoundary`), so activations are int8 only inside
each layer: no fusion, no BatchNorm folding, no int8 between layers (slower and a little less
accurate than the graph path; the warning that announces the fallback says so).
Dynamic / weight-only modes: nn.Linear (and nn.LSTM for dynamic) become their qbackend.nn
module; this is also how `quantize_dynamic` works (no capture needed). In every mode, embedding
tables (nn.Embedding, nn.EmbeddingBag sum/mean) the config's EmbeddingConfig selects become their
rowwise-quantized modules, as in the graph path.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..config import QuantConfig
from ..dispatch import route
from ..observers import Observer
from ..nn import DynamicQuantizedLSTM, QuantizedEmbedding, QuantizedEmbeddingBag
from ..nn.model import QuantizedModel
from ..nn.quant import Quantize
from .layer_spec import LayerSpec
from .layers import build_layer
from .records import activation_record, layer_record, lstm_record, table_record

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
    """float32 in -> Quantize -> a static int8 layer with float32 output."""

    def __init__(self, quantize: Quantize, layer: nn.Module):
        super().__init__()
        self.quantize = quantize
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.quantize(x))


class SwappedModel:
    """The module-swap fallback's prepared model: the copy with observed layers and the tables to quantize."""

    def __init__(self, model: nn.Module, config: QuantConfig, layers: dict[str, ObservedLayer], skipped: list,
                 tables: dict | None = None):
        self.model, self.config, self.layers, self.skipped = model, config, layers, skipped
        self.tables = dict(tables or {})  # name -> (nn.Embedding / nn.EmbeddingBag, EmbeddingConfig)

    def observers(self) -> dict[str, Observer]:
        return {w.observer.name: w.observer for w in self.layers.values() if w.observer is not None}

    def statistics(self) -> list[tuple[str, Observer]]:
        """Every calibration statistic convert reads, as (layer name, observer) in module order."""
        return [(name, w.observer) for name, w in self.layers.items() if w.observer is not None]


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
    layers, skipped, tables = {}, [], {}
    for name, module in list(copy_.named_modules()):
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and name:
            table = _table(name, module, config, skipped)
            if table is not None:
                tables[name] = table
            continue
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
    return SwappedModel(copy_, config, layers, skipped, tables)


def _table(name: str, module: nn.Module, config: QuantConfig, skipped: list):
    """(module, its EmbeddingConfig) if the config quantizes this table, else None (reason in skipped)."""
    cfg = config.for_module(name, module)
    ecfg = cfg.embedding if cfg is not None else None
    if ecfg is None or module.weight.numel() < ecfg.min_weights:
        return None
    if module.max_norm is not None:
        skipped.append((name, "max_norm renormalises the table at lookup"))
    elif isinstance(module, nn.EmbeddingBag) and module.mode not in ("sum", "mean"):
        skipped.append((name, f"{module.mode} bags are not quantized (sum and mean are)"))
    elif ecfg.bits == 4 and module.embedding_dim % 2:
        skipped.append((name, "4-bit tables need an even embedding dim"))
    else:
        return module, ecfg
    return None


def _swap_table(name: str, module: nn.Module, ecfg) -> tuple[nn.Module, dict]:
    bag = isinstance(module, nn.EmbeddingBag)
    shape = {"rows": module.num_embeddings, "dim": module.embedding_dim, "bits": ecfg.bits,
             "fp16_qparams": int(ecfg.qparams_dtype == torch.float16),
             "padding_idx": int(bag and module.padding_idx is not None)}
    r = route("embedding_bag", shape, eight_bit_input=False, forced=ecfg.provider)
    klass = QuantizedEmbeddingBag if bag else QuantizedEmbedding
    new = klass.from_float(module, ecfg.bits, ecfg.qparams_dtype, r.provider)
    return new, table_record("embedding_bag" if bag else "embedding", name, shape, ecfg, r,
                             module.mode if bag else None)


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


def convert_swapped(swapped: SwappedModel, tune=None) -> QuantizedModel:
    model = swapped.model
    info, activations = {}, {}
    for name, wrapper in swapped.layers.items():
        cfg = wrapper.config
        by_batch = cfg.route_by_batch and tune is None
        if isinstance(wrapper.module, nn.LSTM):
            new = DynamicQuantizedLSTM.from_float(wrapper.module, weight_observer=cfg.weight.create(),
                                                  provider=cfg.provider, example_shape=wrapper.x_shape)
            info[name] = lstm_record(name, new.providers, wrapper.x_shape, cfg.provider, by_batch)
        else:
            spec = _spec(name, wrapper)
            if cfg.mode == "static":
                obs = wrapper.observer
                x_qp = obs.compute_qparams()
                value = f"{name}.input"
                activations[value] = activation_record(obs, x_qp)
                layer, r = build_layer(spec, x_qp, tune=tune)
                layer.x_value = value
                top = 255 if x_qp.dtype == torch.uint8 else 127
                new = FloatBoundary(Quantize(x_qp.scale, x_qp.zero_point, x_qp.dtype,
                                             x_qp.qmax if x_qp.qmax < top else None, value=value), layer)
                info[name] = layer_record(spec, name + ".layer", r, "float32", by_batch)
            else:
                new, r = build_layer(spec, tune=tune)
                info[name] = layer_record(spec, name, r, "float32", by_batch)
        model.set_submodule(name, new)
    for name, (module, ecfg) in swapped.tables.items():
        new, info[name] = _swap_table(name, module, ecfg)
        model.set_submodule(name, new)
    return QuantizedModel(model, info, activations)
