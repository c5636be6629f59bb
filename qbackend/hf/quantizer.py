"""QBackendHfQuantizer: the transformers HfQuantizer behind QBackendConfig. On a plain load it
quantizes the model once its float weights are in (mode "dynamic": qbackend.quantize_llm; "static":
static_blocks.quantize_blocks). On a saved folder (pre-quantized) it puts a placeholder where each
quantized module or static block goes before the weights load (llm.checkpoint's CheckpointSlot,
static_blocks' BlockSlot), checks the files against the config's specs, lets transformers' loader
fill the placeholders from safetensors, then builds the modules (and takes quantize_llm's remaining
steps, finish_llm) or decodes the blocks, so the loaded model equals the saved one. Also the hook
that gives a model quantize_llm quantized directly this quantizer (attach_quantizer)."""
from __future__ import annotations

import warnings

import torch
from safetensors import safe_open
from torch import nn
from transformers.quantizers.base import HfQuantizer

from ..llm.checkpoint import (CheckpointError, checkpoint_state, file_tensors, module_specs, modules_from_slots,
                              place_slots)
from ..llm.config import LLMConfig
from ..llm.quantize import finish_llm, on_quantized, quantize_llm
from ..serialization.tensor_file import DTYPE_NAMES
from .config import QBackendConfig
from .static_blocks import blocks_from_slots, blocks_state, place_block_slots, quantize_blocks

__all__ = ["QBackendHfQuantizer", "attach_quantizer"]


def _cpu_only(device_map) -> bool:
    if device_map is None:
        return True
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    return all(str(v) == "cpu" or (isinstance(v, torch.device) and v.type == "cpu") for v in values)


def _untie(model: nn.Module, names) -> None:
    """Drop transformers' weight-tying entries (`all_tied_weights_keys`, on the model and on its
    sub-models, whose keys are relative to them) that involve a quantized module: a quantized output
    projection is no longer the input embedding's weight, and tying would put a float weight back."""
    prefixes = tuple(n + "." for n in names)
    for path, module in model.named_modules():
        tied = getattr(module, "all_tied_weights_keys", None)
        if not isinstance(tied, dict):
            continue
        base = path + "." if path else ""
        for target, source in list(tied.items()):
            if (base + target).startswith(prefixes) or (base + source).startswith(prefixes):
                del tied[target]


def check_files(specs: dict, files) -> None:
    """Every quantized module's tensors are in the safetensors `files` with the spec's dtype and shape
    (read from the headers, before anything loads): transformers' loader would otherwise cast a tensor
    of another dtype, or initialize a missing one, without an error."""
    held = {}
    for path in files or ():
        if not str(path).endswith(".safetensors"):
            raise CheckpointError(f"a qbackend checkpoint is read from safetensors files only, got {path}")
        with safe_open(path, "pt") as f:
            for key in f.keys():
                part = f.get_slice(key)
                held[key] = (part.get_dtype(), tuple(part.get_shape()))
    if not held:
        return
    for name, spec in specs.items():
        for suffix, (shape, dtype) in file_tensors(spec).items():
            key = f"{name}.{suffix}"
            if key not in held:
                raise CheckpointError(f"the checkpoint has no tensor {key}, which its quantization_config's spec of "
                                      f"{name} needs")
            if held[key] != (DTYPE_NAMES[dtype], shape):
                raise CheckpointError(f"{key} must be {dtype} {list(shape)} as its spec says; the file holds "
                                      f"{held[key][0]} {list(held[key][1])}")


def _metadata(files) -> dict[str, str]:
    """The safetensors metadata of a checkpoint's first file ({} without files)."""
    for path in files or ():
        with safe_open(path, "pt") as f:
            return dict(f.metadata() or {})
    return {}


class QBackendHfQuantizer(HfQuantizer):
    """Quantizes on load (QBackendConfig), saves and reloads qbackend's int8 / int4 weights."""

    requires_calibration = False
    quantization_config: QBackendConfig

    def validate_environment(self, *args, device_map=None, **kwargs):
        if not _cpu_only(device_map):
            raise ValueError(f"qbackend runs on the CPU: device_map must be None or 'cpu', got {device_map!r}")
        if self.pre_quantized and not (self.quantization_config.quantized_modules or
                                       self.quantization_config.static_blocks):
            raise ValueError("the saved folder's quantization_config (quant_method 'qbackend') lists no "
                             "quantized_modules; it was not written by save_pretrained of a qbackend model")

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return False  # float weights load as they are; quantization runs after loading

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        config = self.quantization_config
        if self.pre_quantized and config.mode == "static":
            self._metadata = _metadata(checkpoint_files)
            place_block_slots(model, config.static_blocks, self._metadata)
        elif self.pre_quantized:
            place_slots(model, self.quantization_config.quantized_modules, device="meta")  # checks the model first
            check_files(self.quantization_config.quantized_modules, checkpoint_files)
            _untie(model, self.quantization_config.quantized_modules)
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        config = self.quantization_config
        if config.mode == "static":
            if self.pre_quantized:
                blocks_from_slots(model, config.static_blocks, self._metadata)
            else:
                if config.calibration is None:
                    raise ValueError("mode='static' needs calibration: batches of the model's inputs")
                config.static_blocks = quantize_blocks(model, config.calibration, config.quant_config(),
                                                       config.modules_to_not_convert or ())
            model.qbackend_blocks = list(config.static_blocks)
            return model
        if not self.pre_quantized:
            if not model.can_generate():
                warnings.warn("qbackend: mode='dynamic' is made for decoding (a few rows per call); on an encoder's "
                              "batched forward its weight-only schemes run at about FP32's speed and W8A8 "
                              "(activations='int8') at 1.7x, where mode='static' with calibration batches runs 4x "
                              "(BERT-base, benchmarks/results/epyc_zen4/hf_load_bert.md)", UserWarning, stacklevel=2)
            quantize_llm(model, config.llm_config(), config.calibration)
            config.quantized_modules = module_specs(model)
            _untie(model, config.quantized_modules)
            return model
        specs = config.quantized_modules
        built = modules_from_slots(model)
        embedding = next((n for n in built if specs[n]["kind"] == "embedding"), None)
        linears = [n for n in built if n != embedding]
        kept = [n for n, m in model.named_modules() if type(m) is nn.Linear]
        gptq = [n for n in linears if specs[n].get("rounding") == "gptq"]
        finish_llm(model, config.llm_config(), linears, kept, gptq, embedding)
        return model

    def _dequantize(self, model, dtype=None):
        raise NotImplementedError("a qbackend model keeps only its int8 / int4 weights: load the FP32 checkpoint "
                                  "instead of dequantizing")

    def get_state_dict_and_metadata(self, model):
        config = self.quantization_config
        meta = {"qbackend_format": str(config.format_version)}
        if config.mode != "static":
            return checkpoint_state(model), meta
        prefixes = tuple(p + "." for p in config.static_blocks)
        state = {k: v for k, v in model.state_dict().items() if not k.startswith(prefixes)}
        tensors, blocks_meta = blocks_state(model, config.static_blocks)
        return state | tensors, meta | blocks_meta

    def is_serializable(self, *args, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def _is_pretrained(model: nn.Module) -> bool:
    """A transformers PreTrainedModel, known by its interface (this module is imported while
    transformers.modeling_utils finishes loading, so it does not import that module)."""
    return callable(getattr(model, "save_pretrained", None)) and callable(getattr(model, "get_input_embeddings", None)) \
        and hasattr(getattr(model, "config", None), "to_json_string")


def attach_quantizer(model: nn.Module, config: LLMConfig) -> None:
    """Make a transformers model that qbackend.quantize_llm quantized directly (not through
    from_pretrained: e.g. one loaded from a GGUF file, which from_pretrained does not combine with a
    quantization_config) what from_pretrained(quantization_config=...) would have made: its
    save_pretrained then writes the quantized form and config.json its QBackendConfig. Registered
    with quantize_llm (on_quantized). A model that already has qbackend's quantizer is left alone;
    another one (GGUF's, whose weights were dequantized to float on load) is replaced."""
    if not _is_pretrained(model) or isinstance(getattr(model, "hf_quantizer", None), QBackendHfQuantizer):
        return
    qconfig = QBackendConfig.from_llm_config(config)
    qconfig.quantized_modules = module_specs(model)
    _untie(model, qconfig.quantized_modules)
    model.hf_quantizer = QBackendHfQuantizer(qconfig, pre_quantized=False)
    model.is_quantized, model.quantization_method = True, qconfig.quant_method
    model.config.quantization_config = qconfig
    for module in model.modules():
        if _is_pretrained(module):
            module.config._is_quantized = True


on_quantized(attach_quantizer)
