"""QBackendConfig: qbackend as a Hugging Face quantization method. `from_pretrained(...,
quantization_config=QBackendConfig(...))` quantizes the model as it loads (quantize_llm's schemes:
int8 or int4 weights, float or int8 activations, for any model made of nn.Linear layers: decoders
and encoders); `save_pretrained` writes the config (with a spec of every quantized module) into
config.json and the tensors into safetensors; `from_pretrained(saved_dir)` reads them back."""
from __future__ import annotations

import copy
import inspect
from typing import Any

from transformers.utils.quantization_config import QuantizationConfigMixin

from ..config import ATTENTION_MODES, WEIGHT_ROUNDINGS, QuantConfig
from ..llm.checkpoint import CheckpointError, check_spec
from ..llm.config import LLMConfig
from .static_blocks import check_mask_form

__all__ = ["QBackendConfig", "QUANT_METHOD", "FORMAT_VERSION"]

QUANT_METHOD = "qbackend"
FORMAT_VERSION = 1
_DYNAMIC_FIELDS = ("weights", "activations", "group_size", "symmetric", "lm_head", "embedding", "native_norms",
                   "fuse_projections", "native_layers")
_STATIC_FIELDS = ("smoothquant", "weight_rounding", "attention", "per_token_inputs")
_FIELDS = ("mode",) + _DYNAMIC_FIELDS + _STATIC_FIELDS
MODES = ("dynamic", "static")


class QBackendConfig(QuantizationConfigMixin):
    """How qbackend quantizes a Hugging Face model on load.

    mode "dynamic" (default): qbackend.quantize_llm's schemes for any model made of nn.Linear layers
      (decoders and encoders), with the fields of qbackend.LLMConfig, which documents them: weights
      "int8" | "int4", activations "float" | "int8" (quantized per call), group_size, symmetric,
      lm_head, embedding, native_norms, fuse_projections, native_layers.
    mode "static": an encoder's repeated blocks (BERT's layers) each as qbackend's static int8 graph
      (int8 activations calibrated on `calibration`, int8 between the block's layers, the fused
      attention; qbackend.hf.static_blocks), with QuantConfig's smoothquant ("auto" or None),
      weight_rounding ("gptq" or "nearest"), attention ("auto", "fused", "sdpa") and
      per_token_inputs ("auto", True, False: the FFN's down projection reading its input per token
      where calibration shows that lowers its error; lowering/per_token.py); embeddings,
      pooler and heads stay float. The dynamic-only fields must keep their defaults.
    modules_to_not_convert: module names (or prefixes at a dot) kept in float (dynamic: LLMConfig.skip;
      static: a block named, or containing such a name, stays float).
    calibration: dynamic: token ids for GPTQ's rounding of 4-bit weights (see qbackend.quantize_llm);
      static (required): batches of the model's inputs (dicts such as a tokenizer's output, tuples of
      its positional inputs, or input_ids tensors). Used while quantizing, never written to config.json.
    quantized_modules (dynamic) / static_blocks (static): {module name: spec}, filled when the model is
      quantized and written with it; a saved folder is loaded from them. Not for users to set.
    """

    def __init__(self, weights: str = "int8", activations: str = "float", group_size: int | None = None,
                 symmetric: bool | None = None, lm_head: bool | str = True, embedding: bool | str = False,
                 modules_to_not_convert: list[str] | None = None, native_norms: bool = True,
                 fuse_projections: bool = True, native_layers: bool = True, calibration=None,
                 mode: str = "dynamic", smoothquant: str | None = "auto", weight_rounding: str = "gptq",
                 attention: str = "auto", per_token_inputs: bool | str = "auto",
                 quantized_modules: dict | None = None, static_blocks: dict | None = None,
                 format_version: int = FORMAT_VERSION,
                 quant_method: str = QUANT_METHOD, **unknown: Any):
        if unknown:
            raise TypeError(f"QBackendConfig got unknown fields {sorted(unknown)} (a quantization_config written by "
                            f"another version, or edited by hand?); it takes {', '.join(_FIELDS)}, "
                            "modules_to_not_convert and calibration")
        if quant_method != QUANT_METHOD:
            raise ValueError(f"quant_method must be {QUANT_METHOD!r}, got {quant_method!r}")
        if format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {format_version!r} is not one this qbackend reads ({FORMAT_VERSION})")
        if modules_to_not_convert is not None and (isinstance(modules_to_not_convert, str) or not all(
                isinstance(s, str) and s for s in modules_to_not_convert)):
            raise TypeError(f"modules_to_not_convert must be a list of module names, got {modules_to_not_convert!r}")
        self.quant_method = QUANT_METHOD
        self.format_version = FORMAT_VERSION
        self.weights, self.activations = weights, activations
        self.group_size, self.symmetric = group_size, symmetric
        self.lm_head, self.embedding = lm_head, embedding
        self.modules_to_not_convert = None if modules_to_not_convert is None else list(modules_to_not_convert)
        self.native_norms, self.fuse_projections, self.native_layers = native_norms, fuse_projections, native_layers
        self.calibration = calibration
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.smoothquant, self.weight_rounding, self.attention = mode, smoothquant, weight_rounding, attention
        self.per_token_inputs = per_token_inputs
        if mode == "static":
            self.quant_config()  # checks the static fields
            changed = [f for f in _DYNAMIC_FIELDS if getattr(self, f) != _DEFAULTS[f]]
            if changed:
                raise ValueError(f"mode='static' quantizes int8 weights against int8 activations calibrated on data; "
                                 f"{', '.join(changed)} apply to mode='dynamic'")
        llm = self.llm_config()  # checks every field, naming the one that is wrong
        self.group_size, self.symmetric = llm.group_size, llm.symmetric
        if mode != "static" and any(getattr(self, f) != _DEFAULTS[f] for f in _STATIC_FIELDS):
            raise ValueError(f"{', '.join(_STATIC_FIELDS)} apply to mode='static'")
        if static_blocks is not None:
            if mode != "static" or not isinstance(static_blocks, dict) or not static_blocks:
                raise CheckpointError(f"static_blocks must name at least one block of a mode='static' config, got "
                                      f"{static_blocks!r}")
            for name, spec in static_blocks.items():
                if not isinstance(spec, dict) or set(spec) != {"mask"}:
                    raise CheckpointError(f"static_blocks[{name!r}] must be {{'mask': ...}}, got {spec!r}")
                check_mask_form(spec["mask"], f"static_blocks[{name!r}]")
        self.static_blocks = static_blocks
        if quantized_modules is not None:
            if not isinstance(quantized_modules, dict) or not quantized_modules:
                raise CheckpointError(f"quantized_modules must name at least one module, got {quantized_modules!r}")
            for name, spec in quantized_modules.items():
                check_spec(name, spec)
        self.quantized_modules = quantized_modules

    @classmethod
    def from_llm_config(cls, config: LLMConfig) -> "QBackendConfig":
        """The QBackendConfig of the same settings as `config`."""
        return cls(weights=config.weights, activations=config.activations, group_size=config.group_size,
                   symmetric=config.symmetric, lm_head=config.lm_head, embedding=config.embedding,
                   modules_to_not_convert=list(config.skip) or None, native_norms=config.native_norms,
                   fuse_projections=config.fuse_projections, native_layers=config.native_layers)

    def quant_config(self) -> QuantConfig:
        """The QuantConfig of mode='static' (ValueError / TypeError naming a wrong field)."""
        if self.smoothquant not in ("auto", None):
            raise ValueError(f"smoothquant must be 'auto' or None, got {self.smoothquant!r}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise ValueError(f"weight_rounding must be one of {', '.join(WEIGHT_ROUNDINGS)}, got {self.weight_rounding!r}")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {self.attention!r}")
        return QuantConfig(smoothquant=self.smoothquant, weight_rounding=self.weight_rounding, attention=self.attention,
                           per_token_inputs=self.per_token_inputs)

    def llm_config(self) -> LLMConfig:
        """The LLMConfig these fields describe (ValueError / TypeError naming a wrong field)."""
        return LLMConfig(weights=self.weights, activations=self.activations, group_size=self.group_size,
                         symmetric=self.symmetric, lm_head=self.lm_head, embedding=self.embedding,
                         skip=tuple(self.modules_to_not_convert or ()), native_norms=self.native_norms,
                         fuse_projections=self.fuse_projections, native_layers=self.native_layers)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "calibration"})

    def __iter__(self):
        yield from self.to_dict().items()

    def __deepcopy__(self, memo):  # calibration token ids are shared, not copied
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = value if key == "calibration" else copy.deepcopy(value, memo)
        return clone


# The fields' defaults, which the other mode's fields must keep.
_DEFAULTS = {name: p.default for name, p in inspect.signature(QBackendConfig.__init__).parameters.items()}
