"""QBackendConfig: qbackend as a Hugging Face quantization method. `from_pretrained(...,
quantization_config=QBackendConfig(...))` quantizes the model as it loads (quantize_llm's schemes:
int8 or int4 weights, float or int8 activations, for any model made of nn.Linear layers: decoders
and encoders); `save_pretrained` writes the config (with a spec of every quantized module) into
config.json and the tensors into safetensors; `from_pretrained(saved_dir)` reads them back."""
from __future__ import annotations

import copy
from typing import Any

from transformers.utils.quantization_config import QuantizationConfigMixin

from ..llm.checkpoint import CheckpointError, check_spec
from ..llm.config import LLMConfig

__all__ = ["QBackendConfig", "QUANT_METHOD", "FORMAT_VERSION"]

QUANT_METHOD = "qbackend"
FORMAT_VERSION = 1
_FIELDS = ("weights", "activations", "group_size", "symmetric", "lm_head", "embedding", "native_norms",
           "fuse_projections", "native_layers")


class QBackendConfig(QuantizationConfigMixin):
    """How qbackend quantizes a Hugging Face model on load (the fields of qbackend.LLMConfig, which
    document them: weights "int8" | "int4", activations "float" | "int8", group_size, symmetric,
    lm_head, embedding, native_norms, fuse_projections, native_layers), plus:

    modules_to_not_convert: module names (or prefixes at a dot) kept in float (LLMConfig.skip).
    calibration: token ids for GPTQ's rounding of 4-bit weights (see qbackend.quantize_llm); used
      while quantizing, never written to config.json.
    quantized_modules: {module name: spec} (qbackend.llm.checkpoint), filled when the model is
      quantized and written with it; a saved folder is loaded from it. Not for users to set.
    """

    def __init__(self, weights: str = "int8", activations: str = "float", group_size: int | None = None,
                 symmetric: bool | None = None, lm_head: bool | str = True, embedding: bool | str = False,
                 modules_to_not_convert: list[str] | None = None, native_norms: bool = True,
                 fuse_projections: bool = True, native_layers: bool = True, calibration=None,
                 quantized_modules: dict | None = None, format_version: int = FORMAT_VERSION,
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
        llm = self.llm_config()  # checks every field, naming the one that is wrong
        self.group_size, self.symmetric = llm.group_size, llm.symmetric
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
