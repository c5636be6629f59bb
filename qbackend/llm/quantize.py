"""quantize_llm: a decoder LLM's Linears replaced in place by weight-only int8 or int4 modules, so
the user's own model object (a Hugging Face causal LM: `generate`, `config`, its cache classes and
attribute access) keeps working, with its weights in 8 or 4 bits.

Every `nn.Linear` (the attention projections, the MLP, and the output projection unless
`LLMConfig(lm_head=False)`; the output projection gets int8 weights by default whatever the scheme)
becomes a `qbackend.nn.Int4WeightOnlyLinear` (LLMConfig(weights="int4"): 4-bit weights in groups,
qbackend::woq4_linear) or a `qbackend.nn.WeightOnlyLinear` (int8 weights with one scale per output
channel, qbackend::woq_linear); with LLMConfig(activations="int8") their inputs are quantized to int8
per call (woq4a8_linear, woq_a8_linear). csrc/ops/woq_ops.cpp holds the weight-streaming kernels for
decoding and prompts and a dequantized panel for long ones; a model run in bfloat16 or float16
multiplies the weights dequantized to its dtype per call instead. No whitelist of architectures:
whatever the blocks are made of, their nn.Linear modules are found by type (GPT-2's Conv1D
projections are not Linears and stay float). The RMSNorms become qbackend.nn.RMSNorm (one native call
each), found by what they compute (llm/norms.py), and the Linears that read the same input (q, k, v;
gate, up) one fused product (llm/shared_input.py), found and checked on a probe of a few token ids.
The input embedding's rows can be stored in int8 or int4 (LLMConfig.embedding; QuantizedEmbedding).
Decoder layers of Llama's form then run as one native call per step each (llm/decoder_layers.py),
checked on the same probe, and a decoding step of a model whose layers are all native as one Python
call (llm/decoding_step.py), checked on a probe of its own. With calibration token ids, the 4-bit weights take GPTQ's rounding (llm/gptq.py)
instead of the nearest level; with `distributed=True` the ranks of a torch.distributed gloo group
each pass their own shard of the token ids, and GPTQ's statistics are reduced across them
(qbackend.distributed) before any weight is rounded, so every rank quantizes the same model.
"""
from __future__ import annotations

import datetime

import torch
from torch import nn

from ..distributed import ReductionReport, model_identity, reduce_statistics
from ..nn.embedding import QuantizedEmbedding
from ..nn.int4_linear import Int4WeightOnlyLinear
from ..nn.linear import WeightOnlyLinear
from .config import LLMConfig
from .decoder_layers import swap_decoder_layers
from .decoding_step import swap_decoding_step
from .gptq import calibration_batches, gptq_int4, hessians_of, record_hessians
from .norms import swap_rms_norms
from .shared_input import fuse_shared_inputs


_FLOAT_WEIGHTS = (torch.float32, torch.bfloat16, torch.float16)
_QUANTIZED_HOOKS: list = []


def on_quantized(hook) -> None:
    """Register `hook(model, config)`, called on every model quantize_llm (or a checkpoint load
    through finish_llm) has just quantized: how an integration above this layer (qbackend.hf, which
    makes a transformers model's save_pretrained write the quantized form) learns of it."""
    if hook not in _QUANTIZED_HOOKS:
        _QUANTIZED_HOOKS.append(hook)


def _output_projection(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    return out if isinstance(out, nn.Module) else getattr(model, "lm_head", None)


def _quantize_embedding(model: nn.Module, config: LLMConfig) -> str | None:
    """Replace the model's input embedding by a rowwise-quantized one (LLMConfig.embedding); its name,
    or None where it stays float (not an nn.Embedding with float32 weights on the CPU, max_norm set, or
    skipped)."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if config.embedding is False or type(emb) is not nn.Embedding or emb.max_norm is not None \
            or emb.weight.dtype != torch.float32 or emb.weight.device.type != "cpu":
        return None
    name = next((n for n, m in model.named_modules() if m is emb), None)
    if name is None or config.skips(name):
        return None
    model.set_submodule(name, QuantizedEmbedding.from_float(emb, bits=8 if config.embedding == "int8" else 4))
    return name


def _probe(model: nn.Module):
    """A forward of a causal LM on a few tokens returning its logits (None when the model has no
    vocabulary size in a `config`; a model that does not run on token ids fails in the probe's run)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        return None
    ids = (torch.arange(8) * 7919 % vocab).reshape(1, 8)

    def run():
        out = model(input_ids=ids, use_cache=False)
        return out.logits if hasattr(out, "logits") else out[0]

    return run


def _quantized(linear: nn.Linear, name: str, config: LLMConfig, weights: str, hessian=None) -> tuple[nn.Module, bool]:
    """The quantized module for `linear`, and whether it took GPTQ's rounding (with `hessian`)."""
    if weights == "int4":
        if hessian is None:
            return Int4WeightOnlyLinear.from_float(linear, config.group_size, config.symmetric,
                                                   config.activations), False
        (packed, scales, offsets), rounded = gptq_int4(linear.weight, hessian, config.group_size, config.symmetric)
        return Int4WeightOnlyLinear(packed, scales, offsets, linear.bias, config.group_size, linear.in_features,
                                    config.symmetric, config.activations), rounded
    return WeightOnlyLinear.from_float(linear, name=name, activations=config.activations), False


def quantize_llm(model: nn.Module, config: LLMConfig | None = None, calibration=None, *, distributed: bool = False,
                 group=None, timeout: datetime.timedelta | None = None) -> nn.Module:
    """Replace `model`'s Linears (and RMSNorms) in place (see the module docstring); returns `model`
    itself, with `model.qbackend_llm` listing what was quantized, what stayed float, which norms run
    natively and which Linears took GPTQ's rounding.

    calibration: token ids (an int64 tensor [batch, length] or [length], or an iterable of them; a
    few thousand tokens of text like the model's use) for GPTQ's rounding of the 4-bit weights; the
    float model runs on each batch once, before any Linear is replaced. None: nearest rounding.

    distributed=True: a collective over `group` (a torch.distributed gloo group; None: the
    default group), every rank calling it on the same model and config with its own shard of
    the calibration ids (an empty list for a rank with none). GPTQ's statistics are reduced
    across the ranks (qbackend.reduce_calibration's steps, failures naming the rank, `timeout`
    default 30 minutes), so every rank's model is the one a single process would quantize
    from all the shards; `model.qbackend_llm["reduction"]` holds this rank's ReductionReport."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    config = config if config is not None else LLMConfig()
    if not isinstance(config, LLMConfig):
        raise TypeError(f"config must be a qbackend.LLMConfig, got {type(config).__name__}")
    head = _output_projection(model)
    chosen, kept = [], []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        if config.skips(name) or (module is head and config.lm_head_weights is None):
            kept.append(name)
            continue
        if module.weight.device.type != "cpu" or module.weight.dtype not in _FLOAT_WEIGHTS:
            raise ValueError(f"{name}: qbackend quantizes float32, bfloat16 or float16 weights on the CPU, got "
                             f"{module.weight.dtype} on {module.weight.device}")
        chosen.append(name)
    if not chosen:
        raise ValueError("the model has no nn.Linear to quantize" + (f" (kept in float: {', '.join(kept)})"
                                                                     if kept else ""))
    schemes = {name: config.lm_head_weights if model.get_submodule(name) is head else config.weights
               for name in chosen}
    int4 = [name for name in chosen if schemes[name] == "int4"]
    hessians, reduction = {}, None
    if distributed and calibration is None:
        raise ValueError("distributed=True reduces GPTQ's calibration statistics: give this rank's calibration "
                         "token ids (an empty list for a rank with none)")
    if calibration is not None:
        if not int4:
            raise ValueError("calibration sets GPTQ's rounding of 4-bit weights: use it with "
                             "LLMConfig(weights='int4')")
        stats = record_hessians(model, int4, calibration_batches(calibration, allow_empty=distributed))
        if distributed:
            reduction = _reduced(model, config, stats, group, timeout)
        hessians = hessians_of(stats)
    gptq = []
    for name in chosen:
        new, rounded = _quantized(model.get_submodule(name), name, config, schemes[name],
                                  hessians.get(name, (None,))[0])
        if rounded:
            gptq.append(name)
        model.set_submodule(name, new)
    model = finish_llm(model, config, chosen, kept, gptq, _quantize_embedding(model, config))
    if reduction is not None:
        model.qbackend_llm["reduction"] = reduction
    return model


def _reduced(model: nn.Module, config: LLMConfig, stats: dict, group, timeout) -> ReductionReport:
    """GPTQ's statistics reduced across the ranks, after checking they hold the same float model and config."""
    return reduce_statistics(list(stats.items()), model_identity(model, repr(model), config), group, timeout)


def finish_llm(model: nn.Module, config: LLMConfig, quantized: list[str], kept: list[str], gptq: list[str],
               embedding: str | None) -> nn.Module:
    """The steps of quantize_llm after its Linears (named `quantized`) and input embedding (`embedding`,
    or None) hold their quantized modules: the native norms, the same-input fusion and the native
    decoder layers as `config` says, and the `model.qbackend_llm` record. A model loaded from a
    checkpoint (qbackend.llm.checkpoint) takes the same steps, so it equals the model it was saved from."""
    norms = swap_rms_norms(model, config.skips) if config.native_norms else []
    probe = _probe(model) if config.fuse_projections else None
    fused = fuse_shared_inputs(model, probe) if probe is not None else []
    layers = swap_decoder_layers(model, probe) if config.native_layers and fused and norms else []
    step = swap_decoding_step(model) if layers else None
    model.qbackend_llm = {"weights": config.weights, "activations": config.activations, "quantized": list(quantized),
                          "float": list(kept), "embedding": embedding, "native_norms": norms, "fused": fused,
                          "native_layers": layers, "decoding_step": step, "gptq": list(gptq)}
    for hook in _QUANTIZED_HOOKS:
        hook(model, config)
    return model
