"""The public flow: prepare -> calibrate -> convert, and the one-call quantize / quantize_dynamic.

    prepared = qbackend.prepare(model, example_inputs)      # capture, fold, fuse, observe
    for batch in calibration_data:
        prepared(*batch)                                     # FP32 forward + range statistics
    qmodel = qbackend.convert(prepared)                      # int8 model (an nn.Module)

The model is captured with torch.export (qbackend.lowering.capture); if that fails, the supported
layers are swapped one by one instead (qbackend.lowering.module_swap) and a warning gives the
capture error. The user's model is never modified.
"""
from __future__ import annotations

import datetime
import warnings
from typing import Iterable

import torch
from torch import nn

from .core.batches import batches, bind_by_name
from .config import QuantConfig
from .distributed import PartialReductionError, ReductionReport, model_identity, reduce_statistics
from .dispatch import TuneOptions
from .lowering.capture import CaptureError
from .lowering.pipeline import convert_graph, prepare_graph
from .lowering.graph_utils import positional_inputs
from .lowering.module_swap import SwappedModel, convert_swapped, swap_modules
from .lowering.prepare import PreparedGraph
from .nn.inputs import input_signature
from .nn.model import QuantizedModel
from .report.fallback import quantize_within_budget

BACKENDS = ("x86",)


class CaptureFallbackWarning(UserWarning):
    """The model could not be captured as a graph; layers were swapped one by one instead."""


class PreparedModel(nn.Module):
    """The model with observers: run calibration batches through it, then `qbackend.convert` it."""

    def __init__(self, inner: nn.Module, prepared: PreparedGraph | SwappedModel, config: QuantConfig, backend: str):
        super().__init__()
        self.inner = inner
        self._prepared = prepared
        self.config = config
        self.backend = backend
        self.reduction: ReductionReport | None = None  # set by reduce_calibration
        self.broken_reduction: str | None = None  # why a failed reduce_calibration left the statistics unusable

    @property
    def method(self) -> str:
        """"graph" (captured with torch.export) or "module_swap" (the fallback)."""
        return "graph" if isinstance(self._prepared, PreparedGraph) else "module_swap"

    def observers(self) -> dict:
        """Observer name ("layer.input", "layer.output") -> the observer, e.g. to merge calibration
        statistics gathered in several processes (Observer.merge / state_dict)."""
        return self._prepared.observers()

    def forward(self, *args, **kwargs):
        if isinstance(self._prepared, PreparedGraph):
            if kwargs:  # inputs by name, as the model takes them
                inputs = positional_inputs(self.inner)
                if inputs is not None:
                    args, kwargs = bind_by_name(*inputs, args, kwargs)
            return self._prepared.calibration_module()(*args, **kwargs)
        return self.inner(*args, **kwargs)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; qbackend supports: {', '.join(BACKENDS)}")


def _check_model(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type != "cpu":
            raise ValueError(f"the model has {name} on {t.device}; qbackend quantizes for x86 CPUs: move it with "
                             "model.cpu() first")
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() first (post-training quantization "
                         "captures the inference graph: eval-mode BatchNorm and dropout)")


def _as_args(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple of the model's positional inputs (or one tensor), got "
                        f"{type(example_inputs).__name__}")
    return example_inputs


def _check_config(config) -> QuantConfig:
    if config is None:
        return QuantConfig()
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a qbackend.QuantConfig, got {type(config).__name__}")
    return config


def _check_names(model: nn.Module, config: QuantConfig) -> None:
    """A by_name override must name a module of this model (a typo would silently do nothing)."""
    names = [n for n, _ in model.named_modules() if n]
    for key in config.by_name:
        if not any(n == key or n.startswith(key + ".") for n in names):
            close = sorted(n for n in names if n.split(".")[-1] == key.split(".")[-1])[:3]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"config.by_name[{key!r}] matches no module of the model{hint}")


def _check_inputs(args: tuple, kwargs: dict) -> None:
    for i, a in enumerate(list(args) + list(kwargs.values())):
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            raise ValueError(f"example input {i} is on {a.device}; qbackend runs on the CPU")


def prepare(model: nn.Module, example_inputs, backend: str = "x86", config: QuantConfig | None = None,
            example_kwargs: dict | None = None) -> PreparedModel:
    """Capture `model` with `example_inputs` (a tuple of its positional inputs; sizes may vary
    later), fold BatchNorm, fuse, and insert observers. Returns a model to calibrate."""
    _check_backend(backend)
    _check_model(model)
    config = _check_config(config)
    _check_names(model, config)
    args, kwargs = _as_args(example_inputs), dict(example_kwargs or {})
    _check_inputs(args, kwargs)
    try:
        prepared = prepare_graph(model, args, config, kwargs)
        inner = prepared.gm
    except CaptureError as exc:
        warnings.warn(f"qbackend: torch.export could not capture the model ({exc}); quantizing its Linear/Conv2d "
                      "modules one by one instead (no fusion, no int8 between layers)", CaptureFallbackWarning,
                      stacklevel=2)
        prepared = swap_modules(model, args, kwargs, config)
        inner = prepared.model
    return PreparedModel(inner, prepared, config, backend)


def _tune_options(tune, tune_batch_sizes, tune_cache):
    if not tune:
        if tune_batch_sizes is not None or tune_cache is not None:
            raise ValueError("tune_batch_sizes / tune_cache apply with tune=True")
        return None
    if tune_batch_sizes is not None:
        sizes = tuple(int(b) for b in tune_batch_sizes)
        if not sizes or any(b < 1 for b in sizes):
            raise ValueError(f"tune_batch_sizes must be positive batch sizes, got {tune_batch_sizes!r}")
    else:
        sizes = None
    return TuneOptions(batch_sizes=sizes, cache=tune_cache)


def convert(prepared: PreparedModel, tune: bool = False, tune_batch_sizes=None, tune_cache=None) -> nn.Module:
    """The int8 model of a calibrated PreparedModel: a QuantizedModel, an ordinary nn.Module (eager,
    torch.compile and torch.export all run it). `qmodel.qbackend_layers` describes each quantized
    layer, `qmodel.layer(name)` returns its module.

    tune=True times each candidate provider on every layer (at the example inputs' batch size, or
    at each of `tune_batch_sizes`) and keeps the fastest, instead of the rule table's choice;
    results are cached on disk (qbackend.dispatch.tuner.default_cache_path(), or the TuneCache
    given as tune_cache), so converting the same model again does no timing."""
    options = _tune_options(tune, tune_batch_sizes, tune_cache)
    if not isinstance(prepared, PreparedModel):
        raise TypeError(f"convert takes the model qbackend.prepare returned, got {type(prepared).__name__}")
    _check_not_broken(prepared)
    if isinstance(prepared._prepared, PreparedGraph):
        (gm, in_spec, out_spec), layers, activations = convert_graph(prepared._prepared, tune=options)
        arg_names = gm.meta.get("arg_names")
        return QuantizedModel(gm, layers, activations, in_spec, out_spec, arg_names=arg_names,
                              input_signature=input_signature(gm, arg_names),
                              forward_plans=prepared.config.forward_plans)
    return convert_swapped(prepared._prepared, tune=options)


def calibrate(prepared: PreparedModel, calibration_data: Iterable) -> int:
    """Run every batch through the prepared model (no grad); returns the number of batches."""
    n = 0
    with torch.no_grad():
        for args, kwargs in batches(calibration_data, "calibration batches"):
            prepared(*args, **kwargs)
            n += 1
    return n


def reduce_calibration(prepared: PreparedModel, group=None,
                       timeout: datetime.timedelta | None = None) -> ReductionReport:
    """Distributed calibration: after every rank of `group` (a torch.distributed gloo group; None:
    the default group) prepared the same model with the same config and calibrated on its own
    shard of the data, merge every calibration statistic across the ranks. Afterwards each
    rank's `prepared` holds the statistics one process would hold after calibrating on all the
    shards (in rank order), so `qbackend.convert(prepared)` gives the same model, bit for bit, on
    every rank and as that one process would (given the same float results per batch: the same
    torch build and thread count on every rank).

    Collective: every rank of the group must call it. A rank that ended or does not arrive
    within `timeout` (default 30 minutes) is named in a DistributedCalibrationError on the
    others; so is a rank whose model, weights or config differ (checked before any statistic
    moves). A rank that calibrated on no data is allowed (RankWithoutDataWarning). Returns
    this rank's ReductionReport (bytes moved, seconds), also kept as `prepared.reduction`."""
    if not isinstance(prepared, PreparedModel):
        raise TypeError(f"reduce_calibration takes the model qbackend.prepare returned, got {type(prepared).__name__}")
    if prepared.reduction is not None:
        raise ValueError("this prepared model's statistics were already reduced across ranks; reducing again would "
                         "count every rank's batches twice")
    _check_not_broken(prepared)
    inner = prepared._prepared
    code = inner.gm.code if isinstance(inner, PreparedGraph) else repr(inner.model)
    identity = model_identity(prepared.inner, code, (prepared.config, prepared.backend, prepared.method))
    try:
        prepared.reduction = reduce_statistics(inner.statistics(), identity, group, timeout)
    except PartialReductionError as exc:
        prepared.broken_reduction = str(exc)
        raise
    return prepared.reduction


def _check_not_broken(prepared: PreparedModel) -> None:
    if prepared.broken_reduction is not None:
        raise ValueError(f"this prepared model's statistics are unusable: {prepared.broken_reduction}")


def quantize(model: nn.Module, example_inputs, calibration_data: Iterable, config: QuantConfig | None = None,
             backend: str = "x86", example_kwargs: dict | None = None, tune: bool = False,
             tune_batch_sizes=None, tune_cache=None, eval_fn=None, max_drop: float | None = None, *,
             distributed: bool = False, group=None, timeout: datetime.timedelta | None = None) -> nn.Module:
    """prepare + calibrate + convert in one call (tune*: see convert).

    With eval_fn (model -> metric, higher is better) and max_drop, the accuracy-budgeted fallback
    keeps the most sensitive layers in FP32 until eval_fn(qmodel) >= eval_fn(model) - max_drop
    (qbackend.report.fallback); `qmodel.qbackend_fallback` says what it did.

    distributed=True: every rank of `group` calls quantize on the same model and config with its
    own shard as calibration_data (possibly empty), and the statistics are reduced across the
    ranks before convert (`reduce_calibration`, with `group` and `timeout`): every rank returns
    the model one process would quantize from all the shards."""
    if (eval_fn is None) != (max_drop is None):
        raise ValueError("give both eval_fn and max_drop (the accuracy-budgeted fallback), or neither")
    if distributed and eval_fn is not None:
        raise ValueError("distributed=True does not combine with the accuracy-budgeted fallback (eval_fn / max_drop): "
                         "reduce the calibration with distributed=True first, then run the fallback on one rank")
    if eval_fn is not None:
        calibration = list(calibration_data)
        return quantize_within_budget(
            model, _as_args(example_inputs), calibration, _check_config(config),
            lambda cfg: quantize(model, example_inputs, calibration, cfg, backend, example_kwargs, tune,
                                 tune_batch_sizes, tune_cache),
            eval_fn, max_drop, example_kwargs)
    prepared = prepare(model, example_inputs, backend=backend, config=config, example_kwargs=example_kwargs)
    config = prepared.config
    if config.mode == "static":
        if calibrate(prepared, calibration_data) == 0 and not distributed:
            raise ValueError("calibration_data gave no batches; static quantization needs at least one")
        if distributed:
            reduce_calibration(prepared, group, timeout)
    elif distributed:
        raise ValueError(f"distributed=True reduces calibration statistics; config.mode={config.mode!r} has none")
    return convert(prepared, tune=tune, tune_batch_sizes=tune_batch_sizes, tune_cache=tune_cache)


def quantize_dynamic(model: nn.Module, config: QuantConfig | None = None, backend: str = "x86") -> nn.Module:
    """Dynamic quantization (int8 weights, activations quantized per call over their own range) of
    the model's nn.Linear and nn.LSTM modules, swapped in place of a copy; no example inputs and no
    calibration. `config.mode` must be "dynamic" or "weight_only" (the default config is dynamic)."""
    _check_backend(backend)
    _check_model(model)
    config = QuantConfig(mode="dynamic") if config is None else _check_config(config)
    if config.mode == "static":
        raise ValueError("quantize_dynamic needs a config with mode='dynamic' or 'weight_only'; use "
                         "qbackend.quantize for static quantization")
    _check_names(model, config)
    return convert_swapped(swap_modules(model, None, None, config))
