"""Quantization configs: what to quantize and how, as frozen dataclasses.

`QuantConfig` says the mode (static, dynamic or weight-only int8), which observer chooses the
activation ranges and which the weight ranges (`ObserverSpec`, a name from `OBSERVERS` plus its
keyword arguments), how embedding tables are stored (`EmbeddingConfig`: rowwise 8 or 4 bits,
weight-only, for tables of at least `min_weights` values; `embedding=None` keeps them FP32),
and overrides by module type and by module name; an override of `None` keeps that module in
FP32; `smoothquant` (a `SmoothQuantConfig`, model-wide: read from the config passed to prepare,
not from overrides) moves activation outliers into the Linears' weights; `bf16` (model-wide too)
lets float work outside int8 use BF16 where the CPU has it, False keeps it all FP32.
`config.for_module(name, module)` resolves the overrides: the longest matching name (exact, or a
dotted prefix: "encoder.layer.0" covers "encoder.layer.0.attention.query"), then the most
specific module type (MRO order), then the config itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import torch

from .observers import (BestRangeObserver, HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, MSEObserver,
                        Observer, PercentileObserver, PerChannelMinMaxObserver)
from .ops import registry

# The observers a config can name.
OBSERVERS: Mapping[str, type[Observer]] = MappingProxyType({
    "minmax": MinMaxObserver,
    "moving_average_minmax": MovingAverageMinMaxObserver,
    "per_channel_minmax": PerChannelMinMaxObserver,
    "histogram": HistogramObserver,
    "percentile": PercentileObserver,
    "mse": MSEObserver,
    "best_range": BestRangeObserver,
})
MODES = ("static", "dynamic", "weight_only")
ATTENTION_MODES = ("auto", "fused", "sdpa")
WEIGHT_ROUNDINGS = ("gptq", "nearest")
DYNAMIC_DIMS = ("auto", "all", "batch")


@dataclass(frozen=True)
class EmbeddingConfig:
    """Weight-only rowwise quantization of nn.Embedding / nn.EmbeddingBag tables (sum and mean
    bags; max bags and max_norm stay FP32).

    bits: 8 or 4 per value; qparams_dtype: the per-row scale and bias, torch.float16 (4 bytes a
    row; what fbgemm_gpu's kernels take) or torch.float32; min_weights: tables with fewer values
    (rows x dim) stay FP32 (the default quantizes large tables only: 1M values = 4 MB in FP32);
    provider: "builtin", "fbgemm" or "fbgemm_gpu" (None: the dispatcher decides);
    transformer_tables: also quantize tables whose lookups feed a LayerNorm (a transformer's token
    and position embeddings). Off by default: their error rides the residual stream to the output
    (measured on a post-LN BERT with outlier LayerNorm channels: high output SQNR with FP32
    tables, far less with rowwise 8-bit ones: benchmarks/results/design_measurements.md,
    "Transformer tables in FP32"), and they are a lookup, not compute."""

    bits: int = 8
    qparams_dtype: torch.dtype = torch.float16
    min_weights: int = 1 << 20
    provider: str | None = None
    transformer_tables: bool = False

    def __post_init__(self):
        if self.bits not in (8, 4):
            raise ValueError(f"EmbeddingConfig.bits must be 8 or 4, got {self.bits!r}")
        if self.qparams_dtype not in (torch.float16, torch.float32):
            raise ValueError(f"EmbeddingConfig.qparams_dtype must be torch.float16 or torch.float32, "
                             f"got {self.qparams_dtype!r}")
        if isinstance(self.min_weights, bool) or not isinstance(self.min_weights, int) or self.min_weights < 0:
            raise ValueError(f"EmbeddingConfig.min_weights must be a non-negative int, got {self.min_weights!r}")
        if self.provider is not None:
            registry.check_name(self.provider, "embedding", "EmbeddingConfig.provider", optional=True)


@dataclass(frozen=True)
class SmoothQuantConfig:
    """SmoothQuant for static Linears (qbackend/algorithms/smoothquant.py): per input channel c, the
    activation is divided by s_c and the weights' column c multiplied by it, with
    s_c = max|x_c|^alpha / max|w_c|^(1 - alpha) and alpha searched per activation value on the
    calibration data to minimise the Linears' quantized output error.

    alphas: the grid searched (no smoothing is always a candidate too); exhaustive: every alpha of
    the grid is tried, else (the default) every other one (the first and last included), then the
    two grid neighbours of the best: 8 of the 11 default alphas, a third less search time, the
    whole grid's SQNR on BERT-base, all-MiniLM-L6-v2 and the outlier encoder
    (benchmarks/results/epyc_zen4/accuracy.md, the row "SmoothQuant's whole alpha grid searched");
    sample_rows: rows of each smoothed activation kept from calibration (uniformly sampled) for the
    search; sample_outputs: output channels of each Linear its error is measured on (uniformly
    sampled); min_gain: the relative error reduction a smoothing must bring over none to be used."""

    alphas: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    sample_rows: int = 1024
    sample_outputs: int = 256
    min_gain: float = 0.02
    exhaustive: bool = False

    def __post_init__(self):
        alphas = tuple(float(a) for a in self.alphas)
        if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
            raise ValueError(f"SmoothQuantConfig.alphas must be a non-empty sequence of values in [0, 1], "
                             f"got {self.alphas!r}")
        object.__setattr__(self, "alphas", tuple(sorted(set(alphas))))
        if not isinstance(self.exhaustive, bool):
            raise ValueError(f"SmoothQuantConfig.exhaustive must be True or False, got {self.exhaustive!r}")
        if isinstance(self.sample_rows, bool) or not isinstance(self.sample_rows, int) or self.sample_rows < 16:
            raise ValueError(f"SmoothQuantConfig.sample_rows must be an int >= 16, got {self.sample_rows!r}")
        if isinstance(self.sample_outputs, bool) or not isinstance(self.sample_outputs, int) \
                or self.sample_outputs < 16:
            raise ValueError(f"SmoothQuantConfig.sample_outputs must be an int >= 16, got {self.sample_outputs!r}")
        if not 0.0 <= float(self.min_gain) < 1.0:
            raise ValueError(f"SmoothQuantConfig.min_gain must be in [0, 1), got {self.min_gain!r}")


@dataclass(frozen=True)
class ObserverSpec:
    """An observer by name and its keyword arguments (checked by building one)."""

    kind: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in OBSERVERS:
            raise ValueError(f"unknown observer {self.kind!r}; choose one of {', '.join(OBSERVERS)}")
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        self.create()  # bad keyword arguments fail here, when the config is made

    def create(self, name: str | None = None) -> Observer:
        return OBSERVERS[self.kind](name=name, **self.kwargs)


def _default_activation() -> ObserverSpec:
    return ObserverSpec("best_range", {"dtype": torch.uint8})


def _default_weight() -> ObserverSpec:
    return ObserverSpec("per_channel_minmax", {"dtype": torch.int8, "symmetric": True, "axis": 0})


@dataclass(frozen=True)
class QuantConfig:
    """What to quantize and how: the config prepare / quantize / quantize_dynamic take.

    mode: "static" (int8 activations calibrated on data, int8 between layers), "dynamic" (activations
      quantized per call over their own range; Linear and LSTM) or "weight_only" (int8 weights,
      float compute).
    activation, weight: the observers choosing activation and weight ranges (ObserverSpec; weights
      must be int8 and symmetric: the kernels take weight zero point 0). Defaults: "best_range"
      uint8 activations (the lower-L2 of the histogram's two range searches, per value:
      observers/best_range.py) and per-channel symmetric int8 weights.
    by_type, by_name: per-module overrides (a QuantConfig, or None to keep the module in FP32);
      resolved by `for_module`.
    provider: force this kernel provider (a name of qbackend.ops.registry's kernel family), else the
      dispatcher routes each layer (also per layer through by_name, or QBACKEND_PROVIDER).
    embedding: how nn.Embedding / nn.EmbeddingBag tables are stored (EmbeddingConfig: rowwise,
      weight-only); None keeps them FP32.
    smoothquant: SmoothQuant for static Linears (graph capture only): "auto" searches it with
      SmoothQuantConfig() for Linears fed by a LayerNorm (transformer blocks); a SmoothQuantConfig
      for every Linear input it can smooth; None: off.
    bf16: float work outside int8 may use BF16 where this CPU runs it faster than FP32 (model-wide,
      graph capture only): the fused attention core's two products (bf16 operands, fp32
      accumulation), where the CPU's bf16 dot products measure faster than fp32 FMAs (checked per
      call, so a model saved on such a machine runs fp32 products elsewhere). False: all FP32.
    attention: the attention cores (torch's SDPA in the captured graph): "fused" runs them as
      qbackend::attention (one kernel per head, the quantize behind it folded in), "sdpa" keeps
      torch's SDPA, "auto" lets the rule table decide (op "attention" in qbackend.dispatch.rules:
      fused where the CPU's bf16 dot products pay).
    weight_rounding: static Linears' and convs' int8 weights rounded by GPTQ ("gptq",
      algorithms/gptq.py: each level chosen to minimise the layer's output error on the calibration
      data; same scales, same kernels) or each to its nearest level ("nearest").
    bias_correction: the bias takes off the mean output shift the weight rounding leaves on the
      calibration data, (Q s - W) E[x] (algorithms/gptq.py). "auto": every static conv, and the
      static Linears whose weights GPTQ did not round (GPTQ's objective already counts the mean
      shift: correcting it again measured -0.1 dB on the transformers, while convs gain after GPTQ
      too: benchmarks/results/epyc_zen4/accuracy.md); True: every static conv and Linear; False:
      none.
    equalization: cross-layer equalization (lowering/equalize.py) of conv / linear pairs joined by a
      ReLU or nothing: each pair's channel ranges evened out by a per-channel rescaling that leaves
      the FP32 function unchanged (model-wide, graph capture only; off by default: no gain on the
      model zoo, benchmarks/results/epyc_zen4/accuracy.md).
    per_token_inputs: a static Linear whose input is another static Linear's int8 output (a
      transformer FFN's down projection reading the GELU output, whose outliers are whole tokens)
      may read it as float and quantize it per token at run time: each row over its own range
      (TokenQuantizedLinear; the producer then writes float32). "auto": where the calibration data
      show it lowers the layer's output error by at least 1 dB (lowering/per_token.py: +0.6 dB
      output SQNR on BERT-base, +6.8 dB on all-MiniLM-L6-v2, for 2-5% more time per forward:
      benchmarks/results/epyc_zen4/accuracy.md); True: every such Linear; False: none.
    route_by_batch: a Linear / Conv2d whose best provider changes with the call size holds one
      packed weight per provider and picks per call (conv2d: batch; linear: rows); False: one
      provider per layer, routed at the example's size (less memory). Not with a forced provider or
      tune mode, which choose one provider per layer.
    seven_bit_for_speed: on CPUs without VNNI, trade a little of a static layer's precision for speed
      where the tables in qbackend.dispatch.rules measure it: (1) a static Conv2d (groups 1) or
      Linear (from 256 x 256) that the native provider runs gets 7-bit weights (levels -64..64 per output channel,
      rules.SEVEN_BIT_WEIGHTS), which the native GEMM multiplies exactly with AVX2's pair products:
      1.05-1.75x per layer and 1.14-1.48x on the zoo CNNs (AMD EPYC Zen 3) for 0.4-2.8 dB of model SQNR
      (ResNet-18 33.8 -> 31.0 dB, ResNet-50 16.4 -> 15.7, MobileNetV2 13.0 -> 12.6:
      benchmarks/results/epyc_zen3/kernels_avx2_pairs.md); (2) a static Linear / Conv2d whose 7-bit
      route the 7-bit table (rules.SEVEN_BIT) measures more than 1.5x faster than its exact 8-bit one
      reads 7-bit activations (about 6 dB less SQNR on that layer for 1.6-1.8x its speed: on a Zen 3
      only Linears at M = 4 .. 7 over K >= 2048, benchmarks/results/epyc_zen3/kernels_avx2_exact.md).
      False: 8-bit weights and 8-bit activations wherever a provider multiplies them exactly. No
      effect with VNNI (8 bits cost nothing there), nor where the weight observer sets its own
      range (qmin / qmax / reduce_range) or the activation observer sets reduce_range, nor in tune
      mode or with a forced provider. A model quantized with 7-bit weights runs them on every CPU (the
      same integers, so the same outputs).
    forward_plans: eager calls of the converted model replay its forward as one native call per
      input signature, recorded on the signature's second call (qbackend.nn.forward_plan); False:
      every call runs the graph op by op. Switchable later on the model (`qmodel.forward_plans`).
      Only the top-level config's setting counts.
    fusions: chains of int8 layers that the fusion table (qbackend.dispatch.rules.FUSIONS) lists
      for this CPU run as one native call (MobileNetV2's inverted-residual blocks); False: every
      layer is its own call. Only the top-level config's setting counts.
    dynamic_dims: which sizes of the example inputs the captured graph leaves free (graph capture
      only; only the top-level config's setting counts): "auto" the batch of every input and every
      size of integer inputs and of floating inputs up to 3-D (sequence lengths), but not the
      spatial sizes of floating inputs of 4 or more dims (images: the converted model takes the
      example's height and width, and says so when called with others); "all" every size of every
      input (other image sizes too; capture takes longer: lowering/capture.py); "batch" dim 0 only.
    """

    mode: str = "static"
    activation: ObserverSpec = field(default_factory=_default_activation)
    weight: ObserverSpec = field(default_factory=_default_weight)
    by_type: Mapping[type, "QuantConfig | None"] = field(default_factory=dict)
    by_name: Mapping[str, "QuantConfig | None"] = field(default_factory=dict)
    provider: str | None = None
    embedding: EmbeddingConfig | None = field(default_factory=EmbeddingConfig)
    smoothquant: SmoothQuantConfig | str | None = "auto"
    bf16: bool = True
    attention: str = "auto"
    weight_rounding: str = "gptq"
    bias_correction: bool | str = "auto"
    equalization: bool = False
    per_token_inputs: bool | str = "auto"
    route_by_batch: bool = True
    seven_bit_for_speed: bool = True
    forward_plans: bool = True
    fusions: bool = True
    dynamic_dims: str = "auto"

    def __post_init__(self):
        if not isinstance(self.route_by_batch, bool):
            raise TypeError(f"route_by_batch must be True or False, got {self.route_by_batch!r}")
        if not isinstance(self.seven_bit_for_speed, bool):
            raise TypeError(f"seven_bit_for_speed must be True or False, got {self.seven_bit_for_speed!r}")
        if not isinstance(self.forward_plans, bool):
            raise TypeError(f"forward_plans must be True or False, got {self.forward_plans!r}")
        if not isinstance(self.fusions, bool):
            raise TypeError(f"fusions must be True or False, got {self.fusions!r}")
        if not isinstance(self.equalization, bool):
            raise TypeError(f"equalization must be True or False, got {self.equalization!r}")
        if not (isinstance(self.per_token_inputs, bool) or self.per_token_inputs == "auto"):
            raise ValueError(f"per_token_inputs must be 'auto', True or False, got {self.per_token_inputs!r}")
        if not (isinstance(self.bias_correction, bool) or self.bias_correction == "auto"):
            raise ValueError(f"bias_correction must be 'auto', True or False, got {self.bias_correction!r}")
        if not isinstance(self.bf16, bool):
            raise TypeError(f"bf16 must be True or False, got {self.bf16!r}")
        if self.dynamic_dims not in DYNAMIC_DIMS:
            raise ValueError(f"dynamic_dims must be one of {', '.join(DYNAMIC_DIMS)}, got {self.dynamic_dims!r}")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {self.attention!r}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise ValueError(f"weight_rounding must be one of {', '.join(WEIGHT_ROUNDINGS)}, "
                             f"got {self.weight_rounding!r}")
        if not (self.smoothquant is None or self.smoothquant == "auto"
                or isinstance(self.smoothquant, SmoothQuantConfig)):
            raise TypeError(f"smoothquant must be 'auto', a SmoothQuantConfig or None, got {self.smoothquant!r}")
        if self.embedding is not None and not isinstance(self.embedding, EmbeddingConfig):
            raise TypeError(f"embedding must be an EmbeddingConfig or None, got {type(self.embedding).__name__}")
        if self.provider is not None:
            registry.check_name(self.provider, "kernel", "provider", optional=True)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for what, spec in (("activation", self.activation), ("weight", self.weight)):
            if not isinstance(spec, ObserverSpec):
                raise TypeError(f"{what} must be an ObserverSpec, got {type(spec).__name__}")
        w = self.weight.create()
        if w.dtype != torch.int8 or not w.symmetric:
            raise ValueError("weight observers must be int8 and symmetric (the int8 kernels need weight zero point 0)")
        for key, value in self.by_type.items():
            if not (isinstance(key, type) and issubclass(key, torch.nn.Module)):
                raise TypeError(f"by_type keys must be nn.Module subclasses, got {key!r}")
            self._check_override(value, f"by_type[{key.__name__}]")
        for key, value in self.by_name.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"by_name keys must be non-empty module names, got {key!r}")
            self._check_override(value, f"by_name[{key!r}]")
        object.__setattr__(self, "by_type", MappingProxyType(dict(self.by_type)))
        object.__setattr__(self, "by_name", MappingProxyType(dict(self.by_name)))

    @staticmethod
    def _check_override(value, where: str) -> None:
        if value is not None and not isinstance(value, QuantConfig):
            raise TypeError(f"{where} must be a QuantConfig or None (keep in FP32), got {type(value).__name__}")

    def for_module(self, name: str, module: torch.nn.Module) -> "QuantConfig | None":
        """The config for the module at `name`, or None if it stays in FP32."""
        best = None
        for key, value in self.by_name.items():
            if (name == key or name.startswith(key + ".")) and (best is None or len(key) > len(best[0])):
                best = (key, value)
        if best is not None:
            return best[1]
        for klass in type(module).__mro__:
            if klass in self.by_type:
                return self.by_type[klass]
        return self
