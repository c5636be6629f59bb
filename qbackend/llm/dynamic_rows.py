"""Appends to transformers' DynamicCache in place: a layer's `keys` and `values` kept as views of storage
that grows by doubling, so a decoding step writes its one new position instead of copying the whole
cache (DynamicLayer.update concatenates: every step copies every cached position of every layer).

    keys, values = append_rows(cache, layer_idx, key_states, value_states)

    rows = reserved_rows(cache, layer_idx, n)      # a native layer's step writes the rows itself:
    if rows is not None:                           # (layer, key storage, value storage, length)
        keys, values = <n rows written at length into the storages; their first length + n as views>
        record_rows(rows[0], rows[1], rows[2], keys, values)

The cache stays a plain DynamicCache: `keys` / `values` are [batch, kv_heads, length, head_dim] views
(positions strided by the capacity), so transformers' own code (get_seq_length, crop, reorder_cache,
batch_select_indices, to_legacy_cache) reads and replaces them as it would its own tensors. A layer
whose tensors are no longer views at the start of its storage (replaced by such code, or by a caller)
is copied into new storage at its next append. Anything else (another cache or layer class, offloading,
tensors of another dtype, shape or device) goes through the cache's own `update`.
"""
from __future__ import annotations

import torch

from ..core.extension import _C

__all__ = ["append_rows", "record_rows", "reserved_rows"]

_MIN_CAPACITY = 64
_CLASSES = None


def _dynamic_classes():
    """(DynamicCache, DynamicLayer), imported on first use: `import qbackend` does not need transformers
    (a cache passed here comes from it)."""
    global _CLASSES
    if _CLASSES is None:
        from transformers.cache_utils import DynamicCache, DynamicLayer
        _CLASSES = (DynamicCache, DynamicLayer)
    return _CLASSES


def _storage_of(layer, new):
    """The layer's (key storage, value storage) if its keys and values are views at their start that
    `new`'s rows fit (same batch, heads, head_dim, dtype, device); else None."""
    store = layer.__dict__.get("_qbackend_rows")
    if store is None:
        return None
    ks, vs = store[0], store[1]
    for t, s in ((layer.keys, ks), (layer.values, vs)):
        if (type(t) is not torch.Tensor or t.dim() != 4 or t.data_ptr() != s.data_ptr() or t.stride() != s.stride()
                or t.shape[:2] != s.shape[:2] or t.shape[3] != s.shape[3] or t.shape[2] > s.shape[2]):
            return None
    if new.dtype != ks.dtype or new.device != ks.device or new.shape[:2] != ks.shape[:2] or new.shape[3] != ks.shape[3]:
        return None
    return ks, vs


def _grow(layer, length: int, need: int, like: torch.Tensor):
    """New storage for `need` positions or more (doubling), holding the layer's first `length` positions."""
    old = layer.__dict__.get("_qbackend_rows")
    capacity = max(need, 2 * (old[0].shape[2] if old is not None else 0), _MIN_CAPACITY)
    B, KV, _, D = like.shape
    store = tuple(torch.empty(B, KV, capacity, D, dtype=like.dtype, device=like.device) for _ in range(2))
    if length:
        store[0][:, :, :length].copy_(layer.keys)
        store[1][:, :, :length].copy_(layer.values)
    return store


def record_rows(layer, ks, vs, keys, values):
    """Sets the layer's keys and values to `keys` / `values`, views of the storages ks / vs from their
    start; an unchanged layer's next append takes the fast path."""
    layer.keys, layer.values = keys, values
    layer.__dict__["_qbackend_rows"] = (ks, vs, keys, values)


def _written(layer, ks, vs, length, key_states, value_states):
    keys, values = _C.append_rows(ks, vs, length, key_states, value_states)
    record_rows(layer, ks, vs, keys, values)
    return keys, values


def reserved_rows(cache, layer_idx: int, n: int):
    """(layer, key storage, value storage, length) where layer `layer_idx` of `cache` is as append_rows
    left it (its keys and values the views it set) and `n` more positions fit its storage: the caller
    writes the rows at `length` and then calls record_rows. None otherwise (then append_rows)."""
    if _CLASSES is None or type(cache) is not _CLASSES[0] or getattr(cache, "offloading", False):
        return None
    layers = cache.layers
    if layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    store = layer.__dict__.get("_qbackend_rows")
    if store is None or layer.keys is not store[2] or layer.values is not store[3]:
        return None
    length = store[2].shape[2]
    if length + n > store[0].shape[2]:
        return None
    return layer, store[0], store[1], length


def append_rows(cache, layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor, **update_kwargs):
    """Appends key_states / value_states [batch, kv_heads, new, head_dim] to layer `layer_idx` of `cache`;
    returns the layer's (keys, values) with them, as `cache.update(key_states, value_states, layer_idx,
    **update_kwargs)` does (which handles every cache this does not)."""
    DynamicCache, DynamicLayer = _dynamic_classes()
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return cache.update(key_states, value_states, layer_idx, **update_kwargs)
    rows = reserved_rows(cache, layer_idx, key_states.shape[2]) if type(key_states) is torch.Tensor \
        and key_states.dim() == 4 else None
    if rows is not None:  # the layer as this function left it, with room
        try:
            return _written(rows[0], rows[1], rows[2], rows[3], key_states, value_states)
        except ValueError:  # rows of another shape or dtype: below
            pass
    return _append(cache, layer_idx, key_states, value_states, update_kwargs)


def _append(cache, layer_idx, key_states, value_states, update_kwargs):
    """append_rows for a layer whose tensors are not (or no longer) the views of its last append."""
    DynamicCache, DynamicLayer = _dynamic_classes()
    if cache.layer_class_to_replicate is DynamicLayer:
        while len(cache.layers) <= layer_idx:
            cache.layers.append(DynamicLayer())
    if layer_idx >= len(cache.layers) or type(cache.layers[layer_idx]) is not DynamicLayer:
        return cache.update(key_states, value_states, layer_idx, **update_kwargs)
    layer = cache.layers[layer_idx]
    if (type(key_states) is not torch.Tensor or type(value_states) is not torch.Tensor or key_states.dim() != 4
            or key_states.shape != value_states.shape or key_states.dtype != value_states.dtype
            or key_states.device != value_states.device):
        return cache.update(key_states, value_states, layer_idx, **update_kwargs)
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
    keys = layer.keys
    empty = keys is None or keys.numel() == 0
    store = None if empty else _storage_of(layer, key_states)
    if store is None and not empty:
        # tensors of the layer's own (a first append elsewhere, or replaced): adopted if the new rows fit them
        if (keys.dim() != 4 or layer.values.shape != keys.shape or keys.dtype != key_states.dtype
                or layer.values.dtype != key_states.dtype or keys.device != key_states.device
                or keys.shape[:2] != key_states.shape[:2] or keys.shape[3] != key_states.shape[3]):
            return cache.update(key_states, value_states, layer_idx, **update_kwargs)
    length = 0 if empty else keys.shape[2]
    n = key_states.shape[2]
    if store is None or length + n > store[0].shape[2]:
        store = _grow(layer, length, length + n, key_states)
    return _written(layer, store[0], store[1], length, key_states, value_states)
