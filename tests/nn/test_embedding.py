"""QuantizedEmbedding / QuantizedEmbeddingBag as modules: nn.EmbeddingBag's call forms (1-D with
offsets, 2-D fixed-length bags, include_last_offset, per_sample_weights) give what the float
module gives on the dequantized table; bad calls raise; pickling and deep copies repack."""
from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from qbackend.nn import QuantizedEmbedding, QuantizedEmbeddingBag
from qbackend.ops.embedding import dequantize_rowwise


def _float_twin(q, float_module):
    twin = copy.deepcopy(float_module)
    twin.weight.data = dequantize_rowwise(q.packed.table(), q.packed.dim, q.packed.bits)
    return twin


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_bag_call_forms_match_float_module(bits, include_last_offset):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(30, 12, mode="sum", include_last_offset=include_last_offset).eval()
    q = QuantizedEmbeddingBag.from_float(bag, bits=bits)
    twin = _float_twin(q, bag)
    idx = torch.randint(0, 30, (10,))
    off = torch.tensor([0, 4, 4, 7] + ([10] if include_last_offset else []))
    w = torch.rand(10)
    with torch.no_grad():
        assert torch.allclose(q(idx, off), twin(idx, off), atol=1e-6)
        assert torch.allclose(q(idx, off, w), twin(idx, off, per_sample_weights=w), atol=1e-6)
        assert torch.allclose(q(idx.int(), off.int()), twin(idx, off), atol=1e-6)
    if not include_last_offset:
        two_d = torch.randint(0, 30, (4, 3))
        with torch.no_grad():
            assert torch.allclose(q(two_d), twin(two_d), atol=1e-6)
            w2 = torch.rand(4, 3)
            assert torch.allclose(q(two_d, per_sample_weights=w2), twin(two_d, per_sample_weights=w2), atol=1e-6)


def test_embedding_lookup_matches_float_module():
    emb = nn.Embedding(20, 6, padding_idx=1).eval()
    q = QuantizedEmbedding.from_float(emb)
    ids = torch.randint(0, 20, (2, 3, 4))
    assert torch.equal(q(ids), _float_twin(q, emb)(ids))
    assert q.num_embeddings == 20 and q.embedding_dim == 6 and "padding_idx=1" in repr(q)


def test_bad_calls_raise():
    q = QuantizedEmbeddingBag.from_float(nn.EmbeddingBag(10, 4))
    with pytest.raises(ValueError, match="offsets are required"):
        q(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="offsets must be None"):
        q(torch.tensor([[1, 2]]), torch.tensor([0]))
    with pytest.raises(TypeError, match="int32 or int64"):
        q(torch.tensor([1.0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="shape of input"):
        q(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(3))
    with pytest.raises(IndexError, match="out of range"):
        q(torch.tensor([1, 10]), torch.tensor([0]))
    with pytest.raises(ValueError, match="1-D .* or 2-D"):
        q(torch.zeros(1, 1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="max stays FP32"):
        QuantizedEmbeddingBag.from_float(nn.EmbeddingBag(10, 4, mode="max"))
    with pytest.raises(ValueError, match="max_norm"):
        QuantizedEmbedding.from_float(nn.Embedding(10, 4, max_norm=1.0))


def test_pickle_and_deepcopy_repack():
    q = QuantizedEmbeddingBag.from_float(nn.EmbeddingBag(25, 8, mode="mean"), bits=4)
    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    q2 = torch.load(buf, weights_only=False)
    q3 = copy.deepcopy(q)
    idx, off = torch.randint(0, 25, (9,)), torch.tensor([0, 2, 5])
    for other in (q2, q3):
        assert torch.equal(other(idx, off), q(idx, off))
        assert other.packed is not q.packed
