"""Int8KVCache: a transformers Cache that keeps every layer's keys and values in int8, one fp32
scale per (sequence, head, position) row (symmetric: scale = max |row| / 127, values rounded half to
even), a quarter of the float32 cache's bytes plus 4 bytes a row.

    from qbackend.llm.kv_cache import Int8KVCache   # needs transformers, so not in `import qbackend`
    cache = Int8KVCache()
    model.generate(ids, cache=cache, max_new_tokens=...)

Rows are quantized once, when they enter the cache (qbackend._C.append_int8_rows), into storage that
grows by doubling (no copy of the whole cache per token). The native decoder layers
(llm/decoder_layers.py) attend a decoding step straight from the int8 rows (the AVX2 and AVX512
decoding kernels widen them in registers); every other caller (a prompt, a masked step, a model's own attention
code) gets the rows dequantized to float32 from `update`, as from transformers' DynamicCache. The
accuracy cost is measured in benchmarks/kv_cache.py (perplexity with the cache).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..core.extension import _C

__all__ = ["Int8KVCache", "Int8KVLayer"]

_MIN_CAPACITY = 64


def _dequantized_view(index: int, name: str) -> property:
    """`keys` / `values`, which transformers' code may read: the rows dequantized (a copy). Only None can
    be assigned (the base class's initialization and reset)."""

    def get(self):
        return self.dequantized()[index] if self.is_initialized else None

    def set_(self, value):
        if value is not None:
            raise AttributeError(f"Int8KVLayer.{name} is read-only (append quantizes new rows)")

    return property(get, set_)


class Int8KVLayer(CacheLayerMixin):
    """One layer's int8 keys and values (see the module docstring): `k8`, `v8` int8 [batch, kv_heads,
    capacity, head_dim] and `k_scale`, `v_scale` float32 [batch, kv_heads, capacity], of which the
    first `length` positions hold the cache."""

    is_sliding = False
    is_croppable = True

    def __init__(self):
        super().__init__()
        self.length = 0
        self.k8 = self.v8 = self.k_scale = self.v_scale = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.dtype != torch.float32 or value_states.dtype != torch.float32 or key_states.device.type != "cpu":
            raise TypeError(f"Int8KVCache holds float32 CPU keys and values, got {key_states.dtype} on "
                            f"{key_states.device}")
        self.device, self.dtype = key_states.device, key_states.dtype
        self.length = 0
        B, KV, _, D = key_states.shape
        self.k8 = self.v8 = torch.empty(B, KV, 0, D, dtype=torch.int8)
        self.k_scale = self.v_scale = torch.empty(B, KV, 0)
        self.is_initialized = True

    def _reserve(self, n: int) -> None:
        capacity = self.k8.shape[2]
        if self.length + n <= capacity:
            return
        capacity = max(2 * capacity, self.length + n, _MIN_CAPACITY)
        B, KV, _, D = self.k8.shape
        for name in ("k8", "v8"):
            old, new = getattr(self, name), torch.empty(B, KV, capacity, D, dtype=torch.int8)
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)
        for name in ("k_scale", "v_scale"):
            old, new = getattr(self, name), torch.empty(B, KV, capacity)
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Quantize and store the new positions (no dequantized copy returned)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape != value_states.shape or key_states.shape[:2] != self.k8.shape[:2] or \
                key_states.shape[3] != self.k8.shape[3]:
            raise ValueError(f"keys {tuple(key_states.shape)} and values {tuple(value_states.shape)} do not fit the "
                             f"cache's [batch, kv_heads, positions, head_dim] = {tuple(self.k8.shape)}")
        n = key_states.shape[2]
        self._reserve(n)
        _C.append_int8_rows(self.k8, self.k_scale, self.length, key_states)
        _C.append_int8_rows(self.v8, self.v_scale, self.length, value_states)
        self.length += n

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values in float32 [batch, kv_heads, length, head_dim]."""
        n = self.length
        return (self.k8[:, :, :n].float() * self.k_scale[:, :, :n, None],
                self.v8[:, :, :n].float() * self.v_scale[:, :, :n, None])

    keys = _dequantized_view(0, "keys")
    values = _dequantized_view(1, "values")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.append(key_states, value_states)
        return self.dequantized()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.k8 = self.v8 = self.k_scale = self.v_scale = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)

    def _batch(self, select) -> None:
        if self.is_initialized:
            for name in ("k8", "v8", "k_scale", "v_scale"):
                setattr(self, name, select(getattr(self, name)).contiguous())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch(lambda t: t[indices])


class Int8KVCache(Cache):
    """The int8 KV cache (see the module docstring); its layers are made as the model first uses them."""

    int8_rows = True  # what the native decoder layers look for

    def __init__(self):
        super().__init__(layer_class_to_replicate=Int8KVLayer)

    def layer(self, layer_idx: int) -> Int8KVLayer:
        """Layer `layer_idx`'s storage (made if the model has not used it yet)."""
        while len(self.layers) <= layer_idx:
            self.layers.append(Int8KVLayer())
        return self.layers[layer_idx]
