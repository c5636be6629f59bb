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
        embedding=qbackend.EmbeddingConfig(min_weights=0), attention="fused"))
    return model, qmodel


@pytest.fixture
def bf16_products_on():
    """bf16 products wherever AVX512-BF16 runs, also where they do not pay (see test_attention)."""
    from qbackend.core.extension import _C
    before = _C.bf16_products_policy()
    _C.set_bf16_products_policy("on")
    yield
    _C.set_bf16_products_policy(before)


FUSED = qbackend.QuantConfig(attention="fused")


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
        lo, hi = entry.range
        # the additive mask holds finfo(float32).min; a range that saw it would be ~1e38
        assert abs(lo) < 1e3 and abs(hi) < 1e3, (name, entry.range)


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


def _attention_modules(qmodel):
    from qbackend.nn import FusedAttention
    return [m for m in qmodel.modules() if isinstance(m, FusedAttention)]


def _layer_norm_modules(qmodel):
    from qbackend.nn import LayerNormQuantize
    return [m for m in qmodel.modules() if isinstance(m, LayerNormQuantize)]


def test_layer_norms_are_fused_with_their_residual_add_and_quantize(small_bert):
    """Every LayerNorm quantized for the next Linears became one add + LayerNorm + quantize call:
    the embeddings' (its residual: the position embeddings [1, S, C], broadcast over the batch) and
    two per layer (attention output + residual, FFN output + residual); no aten layer_norm is left,
    the only add is the embeddings' token + token-type sum, and no Quantize border."""
    _, qmodel = small_bert
    gm = qmodel.graph_module
    mods = _layer_norm_modules(qmodel)
    assert len(mods) == 1 + 2 * SMALL["num_hidden_layers"]
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and gm.get_submodule(n.target) in mods]
    assert all(n.args[1] is not None for n in calls)
    adds = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.add.Tensor
            and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() == 3]
    assert len(adds) == 1, adds
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.layer_norm.default]
    assert not [m for m in gm.modules() if isinstance(m, qbackend.nn.quant.Quantize)]


def _sdpa_nodes(qmodel):
    return [n for n in qmodel.graph_module.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.aten.scaled_dot_product_attention.default]


def test_attention_core_is_fused_with_its_quantize(small_bert):
    """Each layer's SDPA became one qbackend::attention writing the uint8 input of the attention
    output Linear (no Quantize border left behind it), with that value's qparams."""
    _, qmodel = small_bert
    fused = _attention_modules(qmodel)
    assert len(fused) == SMALL["num_hidden_layers"] and not _sdpa_nodes(qmodel)
    gm = qmodel.graph_module
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), type(fused[0])):
            m = gm.get_submodule(node.target)
            assert m.out_dtype == torch.uint8 and m.value in qmodel.qbackend_activations
            assert all(not (u.op == "call_module" and isinstance(gm.get_submodule(u.target), qbackend.nn.quant.Quantize))
                       for u in node.users)
            assert m.bf16_products  # the default config


def _graph_dtypes(gm):
    out = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.add(val.dtype)
    for t in list(gm.parameters()) + list(gm.buffers()):
        out.add(t.dtype)
    return out


def test_bf16_switch_off_gives_an_fp32_only_graph(bf16_products_on):
    """QuantConfig(bf16=False): no bfloat16 value, parameter or buffer anywhere in the graph, the
    fused attention computes fp32 products, and its outputs equal a model whose attention core is
    torch's fp32 SDPA up to fp32 rounding. With the default (bf16=True) on a CPU with AVX512-BF16
    the attention's products are bf16: the output moves, by less than INT8's own error."""
    model = bert_base(seed=0, **SMALL)
    g = torch.Generator().manual_seed(3)
    cal = [bert_inputs(4, 24, g, vocab_size=2000) for _ in range(2)]
    ids, mask = bert_inputs(4, 24, g, vocab_size=2000)
    q32 = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(bf16=False, attention="fused"))
    assert torch.bfloat16 not in _graph_dtypes(q32.graph_module)
    assert all(not m.bf16_products for m in _attention_modules(q32))
    y32 = _hidden(q32, ids, mask)
    # the same model with each fused attention swapped back for torch's SDPA + quantize
    for m in _attention_modules(q32):
        m.forward = _sdpa_then_quantize(m)
    torch.testing.assert_close(_hidden(q32, ids, mask), y32, rtol=0, atol=float(y32.abs().max()) * 1e-2)
    qbf = qbackend.quantize(model, cal[0], cal, config=FUSED)
    assert all(m.bf16_products for m in _attention_modules(qbf))
    ybf, ref = _hidden(qbf, ids, mask), _hidden(model, ids, mask)
    from qbackend.core.extension import _C
    if _C.bf16_usable():
        assert not torch.equal(ybf, y32)
    assert sqnr(ref, ybf) > sqnr(ref, y32) - 0.5 and sqnr(ref, y32) > 25.0


def _sdpa_then_quantize(m):
    def forward(q, k, v, mask=None):
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, scale=m.scale)
        out = torch.ops.qbackend.quantize_per_tensor(y, m.out_scale, m.out_zero_point, m.out_dtype)
        return out if m.qmax is None else out.clamp_(max=m.qmax)  # a 7-bit output stops at 127, as the module's
    return forward


def test_fused_attention_survives_save_load_and_seven_bit_requantization(small_bert, tmp_path):
    from qbackend.serialization.rebind import requantize_activations
    _, qmodel = small_bert
    g = torch.Generator().manual_seed(5)
    ids, mask = bert_inputs(2, 16, g, vocab_size=2000)
    path = tmp_path / "bert.qb"
    qbackend.save(qmodel, path)
    loaded = qbackend.load(path)
    assert torch.equal(_hidden(loaded, ids, mask), _hidden(qmodel, ids, mask))
    before = {m.value: m.qmax or 255 for m in _attention_modules(loaded) + _layer_norm_modules(loaded)}
    changed = requantize_activations(loaded, seven_bit=True)
    for m in _attention_modules(loaded) + _layer_norm_modules(loaded):
        # 8-bit values are requantized; 7-bit ones (seven_bit_for_speed without VNNI) stay
        assert m.qmax == 127 and (m.value in changed) == (before[m.value] == 255), (m.value, before[m.value])
    assert int(_hidden_attention_max(loaded, ids, mask)) <= 127


def _hidden_attention_max(qmodel, ids, mask):
    top = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: top.append(int(out.max())))
             for m in _attention_modules(qmodel)]
    _hidden(qmodel, ids, mask)
    for h in hooks:
        h.remove()
    return max(top)


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    torch.manual_seed(0)
    return DistilBertModel(DistilBertConfig(n_layers=2, dim=128, n_heads=4, hidden_dim=256, vocab_size=2000)).eval()


def _roberta():
    from transformers import RobertaConfig, RobertaModel
    torch.manual_seed(0)
    return RobertaModel(RobertaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                      intermediate_size=256, vocab_size=2000), add_pooling_layer=False).eval()


@pytest.mark.parametrize("build", [_distilbert, _roberta], ids=["DistilBertModel", "RobertaModel"])
def test_other_encoders_quantize_with_fused_attention(build):
    """DistilBERT (its own attention module and FFN naming) and RoBERTa (padding-aware positions)
    go through the same path: every attention core fused, every Linear int8, close to FP32, and
    padded rows give the real tokens the outputs of the unpadded sequence."""
    model = build()
    g = torch.Generator().manual_seed(4)
    cal = [bert_inputs(4, 24, g, vocab_size=2000) for _ in range(3)]
    qmodel = qbackend.quantize(model, cal[0], cal, config=FUSED)
    assert len(_attention_modules(qmodel)) == 2 and not _sdpa_nodes(qmodel)
    assert sum(info.kind == "linear" for info in qmodel.qbackend_layers.values()) == 12
    ids, mask = bert_inputs(3, 20, g, vocab_size=2000, min_len=6)
    ref, out = _hidden(model, ids, mask), _hidden(qmodel, ids, mask)
    real = mask.bool()
    assert sqnr(ref[real], out[real]) > 25.0
    n = int(mask[1].sum())
    assert n < 20
    alone = _hidden(qmodel, ids[1:2, :n], mask[1:2, :n])[0]
    torch.testing.assert_close(out[1, :n], alone, rtol=0, atol=2e-3)


class _CausalBF16Attention(torch.nn.Module):
    """A decoder-style block whose attention core runs in bfloat16 with is_causal=True."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
        return self.out(y.float().transpose(1, 2).reshape(b, s, 32))


def test_causal_bf16_attention_keeps_its_dtype():
    """SDPA on bfloat16 tensors, causal: fused, its output stays bfloat16 (what SDPA returned), and
    the model stays close to FP32."""
    torch.manual_seed(0)
    model = _CausalBF16Attention().eval()
    g = torch.Generator().manual_seed(1)
    cal = [(torch.randn(4, 9, 32, generator=g),) for _ in range(3)]
    qmodel = qbackend.quantize(model, cal[0], cal, config=FUSED)
    (fused,) = _attention_modules(qmodel)
    assert fused.is_causal and fused.out_dtype == torch.bfloat16
    x = torch.randn(2, 9, 32, generator=g)
    with torch.no_grad():
        assert sqnr(model(x), qmodel(x)) > 25.0


def test_attention_mode_sdpa_and_auto():
    """attention="sdpa" keeps torch's SDPA (and the Quantize behind it) and gives what the fused
    kernel with fp32 products gives, up to fp32 rounding and one quantization level; "auto" (the
    default) fuses exactly where this CPU's bf16 dot products pay (qbackend._C.bf16_products_pay)."""
    from qbackend.core.extension import _C
    model = bert_base(seed=0, **SMALL)
    g = torch.Generator().manual_seed(6)
    cal = [bert_inputs(4, 24, g, vocab_size=2000) for _ in range(2)]
    ids, mask = bert_inputs(4, 24, g, vocab_size=2000)
    kept = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(attention="sdpa", bf16=False))
    assert not _attention_modules(kept) and len(_sdpa_nodes(kept)) == SMALL["num_hidden_layers"]
    fused = qbackend.quantize(model, cal[0], cal, config=qbackend.QuantConfig(attention="fused", bf16=False))
    assert len(_attention_modules(fused)) == SMALL["num_hidden_layers"] and not _sdpa_nodes(fused)
    ref, y_kept, y_fused = _hidden(model, ids, mask), _hidden(kept, ids, mask), _hidden(fused, ids, mask)
    assert sqnr(ref, y_kept) > 25.0 and abs(sqnr(ref, y_kept) - sqnr(ref, y_fused)) < 1.0
    auto = qbackend.quantize(model, cal[0], cal)
    assert bool(_attention_modules(auto)) == bool(_C.bf16_products_pay())
    with pytest.raises(ValueError, match="attention must be one of auto, fused, sdpa"):
        qbackend.QuantConfig(attention="flash")
