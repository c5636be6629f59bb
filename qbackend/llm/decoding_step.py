"""A decoding step in one Python call: the model's decoder stack (the module holding `embed_tokens`,
`layers`, `norm` and `rotary_emb`: LlamaModel, Qwen2Model, MistralModel) runs one new position per
sequence as embedding, rotary embedding, one qbackend._C.DecoderLayer.step per layer (each writing its
rows into the DynamicCache's storage, llm/dynamic_rows.py) and the final norm, without the model's
per-step Python (its mask construction, output capturing, and per layer a module call, the cache's
update and the native layer's own checks: ~1.5 ms a step on SmolLM2's 30 layers).

The stack keeps its identity: its class becomes a subclass of its own class (`NativeStep<Class>`,
llm/own_subclass.py) whose forward takes the decoding step where every condition below holds, and is
the class's own forward otherwise; isinstance, attributes, state_dict keys, copies and pickles are
those of the model's class.

The step applies to a call with `input_ids` of one position and nothing else but an attention mask (None,
or all ones over the cached positions and the new one), position ids and the cache (under either of
its names); a DynamicCache whose every layer is as llm/dynamic_rows.py left it with room for the
position; every layer of the stack a NativeDecoderLayer (not training, no hooks of its own but
transformers' output-capturing ones, which record nothing unless asked); float32
hidden states without gradients; SDPA attention; every attention full (no layer_types other than
full_attention, no sliding window); not tracing or compiling. Its
outputs equal the model's own decoding step bit for bit (the same native layer calls, the same cache),
which swap_decoding_step checks on a probe before it keeps the swap.
"""
from __future__ import annotations

import torch
from torch import nn

from .decoder_layers import NativeDecoderLayer, _attention_implementation
from .dynamic_rows import record_rows, reserved_rows
from .own_subclass import OwnSubclass, give_subclass, restore_class

__all__ = ["NativeDecodingStep", "remove_decoding_step", "swap_decoding_step"]

_STACK_CHILDREN = {"embed_tokens", "layers", "norm", "rotary_emb"}
_CACHE_NAMES = ("cache", "past_key_values")


def _capturing_only(hooks: dict) -> bool:
    """Whether every forward hook is one of transformers' output-capturing hooks, which record nothing
    unless outputs are asked for (the step then does not apply)."""
    return all(getattr(h, "__module__", "") == "transformers.utils.output_capturing" for h in hooks.values())


def _full_attention(config) -> bool:
    """Whether every layer attends every earlier position (no sliding window: the model's own step then
    builds a mask, which sends its attention to SDPA)."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(config, "sliding_window", None) is None


class NativeDecodingStep(OwnSubclass):
    """The decoding step (module docstring) over the class it is mixed into: instances are made by
    swap_decoding_step, never directly."""

    _prefix = "NativeStep"

    def forward(self, input_ids=None, *args, **kwargs):
        out = None if args else self._decoding_step(input_ids, kwargs)
        return out if out is not None else super().forward(input_ids, *args, **kwargs)

    def _decoding_step(self, input_ids, kwargs: dict):
        """The step's output, or None where the model's own forward must run (nothing computed or written)."""
        if (type(input_ids) is not torch.Tensor or input_ids.dim() != 2 or input_ids.shape[1] != 1
                or self.training or torch.compiler.is_compiling() or torch.jit.is_tracing()):
            return None
        cache = None
        position_ids = mask = None
        for key, value in kwargs.items():
            if key in _CACHE_NAMES:
                cache = value if value is not None else cache
            elif key == "attention_mask":
                mask = value
            elif key == "position_ids":
                position_ids = value
            elif value is not None and not (key == "use_cache" and value):
                return None  # inputs_embeds, output options, anything else: the model's forward
        config = self.config
        if cache is None or getattr(config, "output_hidden_states", False) or getattr(config, "output_attentions",
                                                                                        False):
            return None
        layers = self._modules["layers"]
        if len(layers) != config.num_hidden_layers:
            return None
        rows = []
        for layer in layers:
            if (not isinstance(layer, NativeDecoderLayer) or layer.training or layer._forward_pre_hooks
                    or (layer._forward_hooks and not _capturing_only(layer._forward_hooks))):
                return None
            reserved = reserved_rows(cache, layer.native_shape.layer_idx, 1)
            if reserved is None or reserved[1].shape[0] != input_ids.shape[0]:
                return None
            rows.append(reserved)
        length = rows[0][3]
        if any(r[3] != length for r in rows):
            return None
        if (not _full_attention(config) or _attention_implementation(layers[0].self_attn) != "sdpa"
                or (mask is not None and not _all_ones(mask, input_ids.shape[0], length + 1))
                or (position_ids is not None and type(position_ids) is not torch.Tensor)):
            return None
        hidden = self.embed_tokens(input_ids)
        if (type(hidden) is not torch.Tensor or hidden.dtype != torch.float32 or not hidden.is_cpu
                or (hidden.requires_grad and torch.is_grad_enabled())):
            return None
        if position_ids is None:
            position_ids = torch.full((1, 1), length, dtype=torch.long)
        cos, sin = self.rotary_emb(hidden, position_ids=position_ids)
        for layer, (cache_layer, ks, vs, at) in zip(layers, rows):
            hidden, keys, values = layer._current().step(hidden, cos, sin, ks, vs, at, None)
            record_rows(cache_layer, ks, vs, keys, values)
        return _output(self.norm(hidden), cache)


def _all_ones(mask, batch: int, length: int) -> bool:
    return (type(mask) is torch.Tensor and mask.dim() == 2 and mask.shape[0] == batch and mask.shape[1] == length
            and bool(mask.all()))


_OUTPUT = None


def _output(hidden: torch.Tensor, cache):
    """The stack's output as the model's forward returns it (BaseModelOutputWithPast; its cache field is
    `cache` or, in older transformers, `past_key_values`)."""
    global _OUTPUT
    if _OUTPUT is None:
        from transformers.modeling_outputs import BaseModelOutputWithPast
        fields = BaseModelOutputWithPast.__dataclass_fields__
        _OUTPUT = BaseModelOutputWithPast, "cache" if "cache" in fields else "past_key_values"
    return _OUTPUT[0](last_hidden_state=hidden, **{_OUTPUT[1]: cache})


def _stack_of(model: nn.Module):
    """(name, module) of the decoder stack whose layers are all NativeDecoderLayers, or None."""
    for name, m in model.named_modules():
        if (_STACK_CHILDREN <= set(m._modules) and len(m._modules) == len(_STACK_CHILDREN)
                and isinstance(m._modules["layers"], nn.ModuleList) and len(m._modules["layers"])
                and all(isinstance(layer, NativeDecoderLayer) for layer in m._modules["layers"])
                and type(m).forward is not NativeDecodingStep.forward and hasattr(m, "config")):
            return name, m
    return None


def swap_decoding_step(model: nn.Module) -> str | None:
    """Gives `model`'s decoder stack the decoding step in place, if the model has one whose layers are all
    native and the step's logits and cache equal the model's own on a probe (a 4-token prompt, then
    two steps) bit for bit: the stack's name ("" for the model itself), or None."""
    found = _stack_of(model)
    if found is None:
        return None
    name, stack = found
    base = type(stack)
    taken = []

    def counted(input_ids, kwargs):
        out = NativeDecodingStep._decoding_step(stack, input_ids, kwargs)
        taken.append(out is not None)
        return out

    try:
        with torch.no_grad():
            before = _probe(model)
            give_subclass(stack, NativeDecodingStep)
            stack.__dict__["_decoding_step"] = counted
            after = _probe(model)
        same = taken == [False, True, True] and len(before) == len(after) and all(map(torch.equal, before, after))
    except Exception:  # noqa: BLE001  (a model the probe does not fit: not swapped)
        same = False
    finally:
        stack.__dict__.pop("_decoding_step", None)
    if not same:
        stack.__class__ = base
        return None
    return name


def remove_decoding_step(model: nn.Module) -> str | None:
    """Gives `model`'s decoder stack its own class back (every step then runs the model's forward): the
    stack's name, or None where it had no decoding step."""
    for name, m in model.named_modules():
        if isinstance(m, NativeDecodingStep):
            restore_class(m)
            if isinstance(getattr(model, "qbackend_llm", None), dict):
                model.qbackend_llm["decoding_step"] = None
            return name
    return None


def _probe(model: nn.Module) -> list:
    """Logits and cache rows of a 4-token prompt (two sequences) and two greedy steps."""
    from transformers import DynamicCache

    vocab = int(getattr(model.config, "vocab_size", 2))
    ids = torch.randint(0, vocab, (2, 4), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache()
    out = [model(ids, past_key_values=cache, use_cache=True).logits]
    for _ in range(2):
        out.append(model(out[-1][:, -1:].argmax(-1), past_key_values=cache, use_cache=True).logits)
    return out + [t for layer in cache.layers for t in (layer.keys, layer.values)]
