"""Native decoder layers for quantize_llm: a Llama-style layer (pre-norm RMSNorm attention with
rotary embeddings, then a SiLU-gated MLP: Llama, Mistral, Qwen2, SmolLM) whose Linears are quantized
runs as one call of qbackend._C.DecoderLayer per step where the KV cache is a DynamicCache with room in
the storage llm/dynamic_rows.py keeps (the call writes the step's rows), else as two calls and one update
of the model's own KV cache between them (csrc/runtime/decoder_layer.cpp), instead of ~40 torch ops and
ten module calls.

Found by its parts, not its class: a layer whose children are exactly `self_attn` (q/k/v/o_proj),
`mlp` (gate/up/down_proj, and an `act_fn` that computes SiLU), `input_layernorm` and
`post_attention_layernorm` (qbackend RMSNorms), with q, k, v (and gate, up) fused into one product
(llm/shared_input.py). The swap is checked on a probe forward: the model's logits must stay the same
bit for bit, or it is undone. Outputs equal the module path's bit for bit, except decoding steps on
AVX2 and AVX512 CPUs, whose attention runs in qbackend's decoding kernel (equal to SDPA within fp32
rounding). A Qwen3-style layer (norms on q and k), Gemma's (four norms), GPT-2's or Phi-3's (fused
projections of their own) keep the model's code.

A layer made native keeps its identity: its class becomes native_layer_class(its class)
(`Native<Class>`, a subclass of it; llm/own_subclass.py), so isinstance, its children, attributes, hooks (transformers'
output capturing records its output) and state_dict keys stay the model's; it runs its class's own
forward wherever the native path does not apply: inputs other than float32 on the CPU, training or
gradients, an attention other than SDPA or with options the native path does not take (attention
weights, position biases), positional arguments, tracing and torch.compile. With
qbackend.llm.kv_cache.Int8KVCache a decoding step attends the cache's int8 rows directly; transformers'
DynamicCache is appended to in place (llm/dynamic_rows.py). The native layer reads the children's
tensors as they are when it is first called; replacing a child module, or a buffer of one, is seen on
the next call and rebuilds it. Copies and pickles name the model's class and rebuild it.
"""
from __future__ import annotations

from operator import is_
from typing import NamedTuple

import torch
from torch import nn

from ..core.extension import _C
from ..nn.int4_linear import Int4WeightOnlyLinear
from ..nn.linear import WeightOnlyLinear
from ..nn.rms_norm import RMSNorm
from .dynamic_rows import append_rows, record_rows, reserved_rows
from .own_subclass import OwnSubclass, give_subclass, restore_class, subclass_of
from .shared_input import SharedInputLinear

__all__ = ["LayerShape", "NativeDecoderLayer", "native_layer_class", "swap_decoder_layers"]

_LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MLP_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn"}
_MISSING = object()
# Keyword arguments of a layer call that the native path does not implement (it then runs the model's code).
_UNSUPPORTED_KWARGS = ("output_attentions", "position_bias", "softcap", "is_causal", "s_aux", "sinks")


def _attention_implementation(attn: nn.Module) -> str:
    """The attention function a transformers attention module calls ("sdpa", "eager", ...; "sdpa" for a
    module without a config). Read from the config's instance dict where it is kept there: the config's
    attribute lookup costs ~2 us, once per layer and step."""
    config = getattr(attn, "config", None)
    if config is None:
        return "sdpa"
    internal = vars(config).get("_attn_implementation_internal", _MISSING)
    return getattr(config, "_attn_implementation", "sdpa") if internal is _MISSING else internal


def _product(m: nn.Module) -> tuple:
    """DecoderLayer's arguments for one quantized Linear (see decoder_layer.cpp's ProductArgs)."""
    b = m._buffers
    if type(m) is WeightOnlyLinear:
        kind = "int8a8" if m.activations == "int8" else "int8"
        return kind, b["weight_tiles"], b["w_scales"], None, b["bias"], 0, m.in_features, m.out_features
    kind = "int4a8" if m.activations == "int8" else "int4"
    return (kind, b["weight_tiles"], b["scale_tiles"], b["offset_tiles"], b["bias"], m.group_size, m.in_features,
            m.out_features)


def _quantized(m) -> bool:
    return type(m) in (WeightOnlyLinear, Int4WeightOnlyLinear)


def _group_of(members: list) -> nn.Module | None:
    """The fused product of `members` when they are, in order, all the members of one shared-input group."""
    if not all(type(m) is SharedInputLinear for m in members):
        return None
    group = members[0]._group
    if any(m._group is not group or m.index != i for i, m in enumerate(members)) or len(group.sizes) != len(members):
        return None
    return group.fused if _quantized(group.fused) else None


def _computes_silu(act: nn.Module) -> bool:
    x = torch.linspace(-8, 8, 97)
    try:
        with torch.no_grad():
            return bool(torch.equal(act(x), nn.functional.silu(x)))
    except Exception:  # noqa: BLE001  (not a one-input activation)
        return False


def _parts(layer: nn.Module) -> dict | None:
    """What the native layer needs from `layer`, or None where `layer` is not of the native form."""
    children = dict(layer.named_children())
    if set(children) != _LAYER_CHILDREN:
        return None
    attn, mlp = children["self_attn"], children["mlp"]
    if set(dict(attn.named_children())) != _ATTENTION_CHILDREN or set(dict(mlp.named_children())) != _MLP_CHILDREN:
        return None
    norms = children["input_layernorm"], children["post_attention_layernorm"]
    if not all(type(n) is RMSNorm and n.weight.dtype == torch.float32 for n in norms):
        return None
    qkv = _group_of([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = _group_of([mlp.gate_proj, mlp.up_proj])
    if qkv is None or gate_up is None or not _quantized(attn.o_proj) or not _quantized(mlp.down_proj):
        return None
    head_dim, layer_idx = getattr(attn, "head_dim", None), getattr(attn, "layer_idx", None)
    scaling = getattr(attn, "scaling", None)
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2 or not isinstance(layer_idx, int) \
            or not isinstance(scaling, (float, int)):
        return None
    q_out, kv_out = attn.q_proj.out_features, attn.k_proj.out_features
    if q_out % head_dim or kv_out % head_dim or attn.v_proj.out_features != kv_out or \
            (q_out // head_dim) % max(kv_out // head_dim, 1) or not kv_out:
        return None
    if not _computes_silu(mlp.act_fn):
        return None
    return {"qkv": qkv, "gate_up": gate_up, "heads": q_out // head_dim, "kv_heads": kv_out // head_dim,
            "head_dim": head_dim, "scaling": float(scaling), "layer_idx": layer_idx}


class LayerShape(NamedTuple):
    """What the native layer needs beyond the children: the layer's index in the cache and its heads."""

    layer_idx: int
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float


class NativeDecoderLayer(OwnSubclass):
    """A decoder layer of the native form (see the module docstring) whose class was made
    native_layer_class(its class) by swap_decoder_layers: the layer object itself, with its children,
    hooks and attributes, computing natively where it applies and by its class's forward elsewhere; a
    qbackend._C.DecoderLayer built on first use (copies and pickles build it again). Never constructed
    directly."""

    _prefix = "Native"
    _transient = {"_native": None, "_watch": ()}

    def _apply(self, fn, recurse=True):
        self.__dict__["_native"] = None
        return super()._apply(fn, recurse)

    def _build(self):
        """The native layer from the children as they are now, and what is watched for replacement: each
        (dict, key, object) on the paths to the tensors it holds, kept as three tuples (dicts, keys,
        objects) for _current's check."""
        attn, mlp = self._modules["self_attn"], self._modules["mlp"]
        parts = _parts(self)
        if parts is None:
            raise ValueError("the layer's children are no longer of the native form (a quantized, fused "
                             "Llama-style layer)")
        norm1, norm2 = self._modules["input_layernorm"], self._modules["post_attention_layernorm"]
        shape = self.native_shape
        native = _C.DecoderLayer(norm1.weight, norm1.eps, _product(parts["qkv"]), _product(attn.o_proj), norm2.weight,
                                 norm2.eps, _product(parts["gate_up"]), _product(mlp.down_proj), shape.heads,
                                 shape.kv_heads, shape.head_dim, shape.scaling)
        watch = [(self._modules, n, m) for n, m in self._modules.items()]
        for module in (attn, mlp):
            watch += [(module._modules, n, m) for n, m in module._modules.items()]
        for module in (attn.q_proj, mlp.gate_proj):
            watch.append((module._modules, "fused", module._modules.get("fused")))
        for module in (parts["qkv"], parts["gate_up"], attn.o_proj, mlp.down_proj):
            watch += [(module._buffers, n, t) for n, t in module._buffers.items()]
            watch += [(module.__dict__, n, module.__dict__[n]) for n in ("activations", "group_size")
                      if n in module.__dict__]
        for norm in (norm1, norm2):
            watch += [(norm._parameters, "weight", norm._parameters["weight"]), (norm.__dict__, "eps", norm.eps)]
        self.__dict__["_native"] = native
        self.__dict__["_watch"] = tuple(zip(*watch))
        return native

    def _current(self):
        """The native layer for the children as they are now (rebuilt if one was replaced)."""
        native = self.__dict__.get("_native")
        if native is None or not all(map(is_, map(dict.get, *self._watch[:2]), self._watch[2])):
            native = self._build()
        return native

    def _runs_natively(self, hidden, kwargs) -> bool:
        attention_mask, position_embeddings = kwargs.get("attention_mask"), kwargs.get("position_embeddings")
        if (type(hidden) is not torch.Tensor or hidden.dtype != torch.float32 or not hidden.is_cpu
                or hidden.ndim != 3 or self.training or (hidden.requires_grad and torch.is_grad_enabled())):
            return False
        if type(position_embeddings) is not tuple or len(position_embeddings) != 2:
            return False
        if attention_mask is not None and type(attention_mask) is not torch.Tensor:
            return False
        if _attention_implementation(self._modules["self_attn"]) != "sdpa":
            return False
        if any(kwargs.get(k) for k in _UNSUPPORTED_KWARGS):
            return False
        return not (torch.compiler.is_compiling() or torch.jit.is_tracing())

    def forward(self, hidden_states, *args, **kwargs):
        if args or not self._runs_natively(hidden_states, kwargs):
            return super().forward(hidden_states, *args, **kwargs)
        native = self._current()
        cos, sin = kwargs["position_embeddings"]
        attention_mask = kwargs.get("attention_mask")
        cache = kwargs.get("cache")
        cache = cache if cache is not None else kwargs.get("past_key_values")
        layer_idx = self.native_shape.layer_idx
        if cache is not None and not getattr(cache, "int8_rows", False):
            rows = reserved_rows(cache, layer_idx, hidden_states.shape[1])
            if rows is not None:  # the cache's storage has room: the rows written by the same native call
                out, keys, values = native.step(hidden_states, cos, sin, rows[1], rows[2], rows[3], attention_mask)
                record_rows(rows[0], rows[1], rows[2], keys, values)
                return out
        q, k, v = native.attention_inputs(hidden_states, cos, sin)
        if cache is not None and getattr(cache, "int8_rows", False):  # qbackend.llm.kv_cache.Int8KVCache
            rows = cache.layer(layer_idx)
            rows.append(k, v)
            if hidden_states.shape[1] == 1 and attention_mask is None:  # a decoding step: attend the int8 rows
                return native.finish_int8(hidden_states, q, rows.k8, rows.k_scale, rows.v8, rows.v_scale, rows.length)
            k, v = rows.dequantized()
        elif cache is not None:
            # the arguments transformers' attention passes to the cache
            update = {key: value for key, value in kwargs.items()
                      if key not in ("attention_mask", "position_embeddings", "cache", "past_key_values")}
            k, v = append_rows(cache, layer_idx, k, v, kwargs=update)
        return native.finish(hidden_states, q, k, v, attention_mask)

    def extra_repr(self) -> str:
        shape = self.native_shape
        own = super().extra_repr()
        return (own + ", " if own else "") + (f"native: heads={shape.heads}, kv_heads={shape.kv_heads}, "
                                               f"head_dim={shape.head_dim}")


def native_layer_class(base: type) -> type:
    """The subclass of the decoder layer class `base` that computes natively (one per class)."""
    return subclass_of(NativeDecoderLayer, base)


def swap_decoder_layers(model: nn.Module, run) -> list[str]:
    """Make `model`'s decoder layers of the native form NativeDecoderLayers in place (their class becomes
    native_layer_class(their class)), checked by `run()` (a forward on a probe returning logits): the
    names made native (none if the check failed)."""
    found = [(name, m, parts) for name, m in model.named_modules()
             if name and not isinstance(m, NativeDecoderLayer) and (parts := _parts(m)) is not None]
    if not found:
        return []
    try:
        with torch.no_grad():
            before = run()
    except Exception:  # noqa: BLE001  (a model the probe does not fit: nothing swapped)
        return []
    for _, m, parts in found:
        give_subclass(m, NativeDecoderLayer, _native=None, _watch=(),
                      native_shape=LayerShape(parts["layer_idx"], parts["heads"], parts["kv_heads"],
                                              parts["head_dim"], parts["scaling"]))
    try:
        with torch.no_grad():
            after = run()
        same = after.shape == before.shape and bool(torch.equal(after, before))
    except Exception:  # noqa: BLE001  (a model whose code does not fit the native layer: undone below)
        same = False
    if not same:
        for _, m, _ in found:
            restore_class(m, "native_shape", "_native", "_watch")
        return []
    return [name for name, _, _ in found]
