"""Transformer encoders through the graph path: padding does not change the real tokens' outputs
(the attention mask is an input, never calibrated as an activation), the token embeddings stay
float by default, and the sentence-embedding head (mean pooling + L2 norm) stays close to FP32."""
from __future__ import annotations

import pytest
import torch

import qbackend
from qbackend.models import bert_base, bert_inputs, sentence_embeddings
from qbackend.models.bert import PAD_ID
from qbackend.nn import QuantizedEmbedding

from .toy_models import sqnr

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")
SMALL = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256, vocab_size=2000)


@pytest.fixture(scope="module")
def small_bert():
    model = bert_base(seed=0, **SMALL)
    g = torch.Generator().manual_seed(1)
    cal = [bert_inputs(4, 24, g, vocab_size=2000) for _ in range(3)]
    qmodel = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(
        embedding=qbackend.EmbeddingConfig(min_weights=0)))
    return model, qmodel


def _hidden(model, ids, mask):
    with torch.no_grad():
        out = model(ids, mask)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def test_padding_does_not_change_real_tokens(small_bert):
    model, qmodel = small_bert
    g = torch.Generator().manual_seed(7)
    ids, mask = bert_inputs(3, 20, g, vocab_size=2000, min_len=6)
    lengths = mask.sum(dim=1).tolist()
    assert min(lengths) < 20  # some rows really are padded
    padded = _hidden(qmodel, ids, mask)
    ref = _hidden(model, ids, mask)
    for i, n in enumerate(lengths):
        alone = _hidden(qmodel, ids[i:i + 1, :n], mask[i:i + 1, :n])[0]
        # same integers in, same static qparams: the real tokens' outputs agree to float rounding
        # of the attention over a different number of masked keys
        torch.testing.assert_close(padded[i, :n], alone, rtol=0, atol=2e-3)
        assert sqnr(ref[i, :n], alone) > 25.0


def test_attention_mask_is_not_calibrated(small_bert):
    _, qmodel = small_bert
    table = qmodel.qbackend_activations
    assert table
    for name, entry in table.items():
        lo, hi = entry["range"]
        # the additive mask holds finfo(float32).min; a range that saw it would be ~1e38
        assert abs(lo) < 1e3 and abs(hi) < 1e3, (name, entry["range"])


def test_transformer_embeddings_stay_float_by_default():
    model = bert_base(seed=0, **SMALL)
    g = torch.Generator().manual_seed(2)
    cal = [bert_inputs(2, 16, g, vocab_size=2000) for _ in range(2)]
    with pytest.warns(qbackend.lowering.convert.FP32FallbackWarning, match="transformer's embedding"):
        default = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(
            embedding=qbackend.EmbeddingConfig(min_weights=0)))
    assert not any(isinstance(m, QuantizedEmbedding) for m in default.modules())
    forced = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(
        embedding=qbackend.EmbeddingConfig(min_weights=0, transformer_tables=True)))
    assert sum(isinstance(m, QuantizedEmbedding) for m in forced.modules()) == 3  # word, position, type


def test_sentence_embeddings_close_to_fp32(small_bert):
    model, qmodel = small_bert
    g = torch.Generator().manual_seed(9)
    ids, mask = bert_inputs(4, 24, g, vocab_size=2000)
    e_ref = sentence_embeddings(_hidden(model, ids, mask), mask)
    e_q = sentence_embeddings(_hidden(qmodel, ids, mask), mask)
    torch.testing.assert_close(e_ref.norm(dim=-1), torch.ones(4))
    cos = torch.nn.functional.cosine_similarity(e_ref, e_q, dim=-1)
    assert float(cos.min()) > 0.999
    # the head ignores padded positions: changing a padded token's hidden state changes nothing
    h = _hidden(model, ids, mask).clone()
    row = int((mask.sum(dim=1) < 24).nonzero()[0])
    h[row, -1] += 100.0
    assert ids[row, -1] == PAD_ID
    torch.testing.assert_close(sentence_embeddings(h, mask), e_ref)
