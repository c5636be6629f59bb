"""append_rows (qbackend/llm/dynamic_rows.py): appends to a DynamicCache in place give the rows that the
cache's own update (torch.cat) gives, through transformers' own crop, reorder and batch selection, and
write into storage kept across steps; other caches and layers go through their update."""
from __future__ import annotations

import pytest
import torch

from qbackend.llm.dynamic_rows import append_rows

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402


def _rows(b, n, seed, kv=2, d=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, kv, n, d, generator=g).to(dtype), torch.randn(b, kv, n, d, generator=g).to(dtype)


def _same(ours: DynamicCache, ref: DynamicCache, layers: int) -> None:
    assert ours.get_seq_length() == ref.get_seq_length()
    for i in range(layers):
        assert torch.equal(ours.layers[i].keys, ref.layers[i].keys)
        assert torch.equal(ours.layers[i].values, ref.layers[i].values)


def test_appends_match_the_cache_update_and_reuse_storage():
    ours, ref = DynamicCache(), DynamicCache()
    seed = 0
    for step, n in enumerate([5, 1, 1, 1, 70, 1, 3]):  # a prompt, decoding steps, past the first capacity
        for layer in range(2):
            k, v = _rows(2, n, seed)
            seed += 1
            got = append_rows(ours, layer, k, v)
            want = ref.update(k, v, layer)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        _same(ours, ref, 2)
        if step in (1, 2, 3):  # within the first capacity: the same storage, written in place
            assert ours.layers[0].keys.data_ptr() == first_ptr
        first_ptr = ours.layers[0].keys.data_ptr()
    assert ours.layers[0].keys.shape[2] == 82 and not ours.layers[0].keys.is_contiguous()


def test_crop_reorder_and_batch_selection_through_transformers():
    ours, ref = DynamicCache(), DynamicCache()
    for cache in (ours, ref):
        k, v = _rows(3, 6, 1)
        (append_rows if cache is ours else lambda c, i, k, v: c.update(k, v, i))(cache, 0, k, v)

    def both(fn):
        fn(ours)
        fn(ref)

    def append(seed, b=3):
        k, v = _rows(b, 1, seed)
        append_rows(ours, 0, k, v)
        ref.update(k, v, 0)
        _same(ours, ref, 1)

    append(2)
    both(lambda c: c.crop(-2))  # keys become a shorter view of the same storage: written over next
    append(3)
    assert ours.get_seq_length() == 6
    both(lambda c: c.reorder_cache(torch.tensor([2, 0, 1])))  # new tensors: copied into new storage
    append(4)
    both(lambda c: c.batch_select_indices(torch.tensor([0, 2])))
    append(5, b=2)
    both(lambda c: c.batch_repeat_interleave(2))
    append(6, b=4)
    for _ in range(70):
        append(7, b=4)


def test_other_caches_layers_and_rows_use_their_update():
    calls = []

    class Counting(DynamicCache):
        def update(self, *args, **kwargs):
            calls.append(1)
            return super().update(*args, **kwargs)

    k, v = _rows(1, 3, 0)
    append_rows(Counting(), 0, k, v)
    assert calls == [1]
    sliding = DynamicCache()
    sliding.layers.append(DynamicSlidingWindowLayer(sliding_window=4))
    out = append_rows(sliding, 0, *_rows(1, 6, 1))
    assert out[0].shape[2] == 6 and type(sliding.layers[0]) is DynamicSlidingWindowLayer
    mixed = DynamicCache()
    append_rows(mixed, 0, k, v)
    ref = DynamicCache()
    ref.update(k, v, 0)
    k64, v64 = _rows(1, 2, 2, dtype=torch.float64)  # another dtype: what the cache's own update gives
    want, got = ref.update(k64, v64, 0), append_rows(mixed, 0, k64, v64)
    assert got[0].dtype == want[0].dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert isinstance(mixed.layers[0], DynamicLayer) and mixed.get_seq_length() == 5


def test_the_append_op_checks_its_arguments():
    from qbackend.core.extension import _C

    ks, vs = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    k, v = _rows(1, 2, 0)
    keys, values = _C.append_rows(ks, vs, 1, k, v)
    assert keys.shape == (1, 2, 3, 8) and keys.data_ptr() == ks.data_ptr()
    assert torch.equal(keys[:, :, 1:], k) and torch.equal(values[:, :, 1:], v) and not ks[:, :, 0].any()
    with pytest.raises(ValueError, match="capacity of 4"):
        _C.append_rows(ks, vs, 3, k, v)
    with pytest.raises(ValueError, match="keys and values"):
        _C.append_rows(ks, vs, 0, k, v[:, :, :1])
    with pytest.raises(ValueError, match="key_rows and value_rows"):
        _C.append_rows(ks.transpose(2, 3), vs, 0, k, v)
    with pytest.raises(ValueError, match="key_rows and value_rows"):
        _C.append_rows(ks, vs.double(), 0, k, v)
