"""qbackend.quantize_llm on Hugging Face causal LMs built from configs (no download): the user's own
model object keeps working (generate, config, attribute access), every Linear but the skipped ones
becomes a WeightOnlyLinear whose weight is the per-channel int8 rounding of the float one, the
logits stay close to FP32, and bad input is an error naming it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import WeightOnlyLinear

transformers = pytest.importorskip("transformers")


def _llama(seed=0, tie=True):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(cfg).eval()


def _ids(n=2, t=12, seed=1):
    return torch.randint(0, 300, (n, t), generator=torch.Generator().manual_seed(seed))


def _sqnr(ref, out):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum()))


def test_llama_in_place_close_to_fp32_and_generates():
    model = _llama()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    floats = {n: m.weight.detach().clone() for n, m in model.named_modules() if type(m) is nn.Linear}
    out_model = qbackend.quantize_llm(model, qbackend.LLMConfig(fuse_projections=False))  # each Linear its own
    assert out_model is model
    assert set(model.qbackend_llm["quantized"]) == set(floats) and model.qbackend_llm["float"] == []
    assert len(floats) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    for name, w in floats.items():
        q = model.get_submodule(name)
        assert isinstance(q, WeightOnlyLinear)
        scale = w.abs().amax(dim=1) * 2 / 255  # symmetric int8: [-amax, amax] over the 255 steps of [-128, 127]
        torch.testing.assert_close(q.w_scales.reshape(-1), scale, rtol=1e-6, atol=0)
        assert float((q.weight_int8.float() - w / scale[:, None]).abs().max()) <= 0.5 + 1e-4  # nearest level
    assert isinstance(model.model.embed_tokens, nn.Embedding)  # tied input embedding stays float
    with torch.no_grad():
        out = model(ids).logits
    assert out.shape == ref.shape and _sqnr(ref, out) > 30
    gen = model.generate(ids[:1], max_new_tokens=6, do_sample=False)
    assert gen.shape == (1, 18) and torch.equal(gen[:, :12], ids[:1])
    assert model.config.num_hidden_layers == 2  # the HF object is intact


def test_lm_head_and_skip_keep_float():
    model = _llama(tie=False)
    qbackend.quantize_llm(model, qbackend.LLMConfig(lm_head=False, skip=("model.layers.1.mlp",)))
    assert type(model.lm_head) is nn.Linear
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear
    assert isinstance(model.model.layers[1].self_attn.o_proj, WeightOnlyLinear)
    assert set(model.qbackend_llm["float"]) == {"lm_head", "model.layers.1.mlp.gate_proj",
                                                 "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"}


def test_gpt2_style_conv1d_blocks_are_found_by_type():
    """GPT-2 uses transformers' Conv1D, not nn.Linear: only its lm_head is a Linear."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100,
                                                                 n_positions=32)).eval()
    qbackend.quantize_llm(model)
    assert model.qbackend_llm["quantized"] == ["lm_head"]


def test_bad_input_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no nn.Linear to quantize"):
        qbackend.quantize_llm(nn.Sequential(nn.Embedding(4, 3)))
    with pytest.raises(ValueError, match=r"no nn.Linear to quantize \(kept in float: 0\)"):
        qbackend.quantize_llm(nn.Sequential(nn.Linear(3, 3)), qbackend.LLMConfig(skip=("0",)))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        qbackend.quantize_llm("model")
    with pytest.raises(ValueError, match="weights must be one of int8, int4, got 'int3'"):
        qbackend.LLMConfig(weights="int3")
    with pytest.raises(TypeError, match="skip must be a tuple of module names"):
        qbackend.LLMConfig(skip="lm_head")
    with pytest.raises(ValueError, match=r"0: qbackend quantizes float32, bfloat16 or float16 weights on the CPU, "
                                         r"got torch.float64"):
        qbackend.quantize_llm(nn.Sequential(nn.Linear(3, 3).double()))


@pytest.mark.parametrize("group_size,symmetric", [(32, False), (128, True)])
def test_int4_groups_in_place(group_size, symmetric):
    from qbackend.nn import Int4WeightOnlyLinear

    model = _llama()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    qbackend.quantize_llm(model, qbackend.LLMConfig(weights="int4", group_size=group_size, symmetric=symmetric))
    q = model.model.layers[0].mlp.down_proj  # in_features 160: a partial last group of 128
    assert isinstance(q, Int4WeightOnlyLinear) and (q.group_size, q.symmetric) == (group_size, symmetric)
    assert model.qbackend_llm["weights"] == "int4" and len(model.qbackend_llm["quantized"]) == 15
    with torch.no_grad():
        out = model(ids).logits
    assert _sqnr(ref, out) > 12  # 4-bit weights: coarser than int8's > 30 dB, far from noise
    assert model.generate(ids[:1], max_new_tokens=4, do_sample=False).shape == (1, 16)


def test_int4_settings_are_checked():
    with pytest.raises(ValueError, match="group_size and symmetric apply to weights='int4', not 'int8'"):
        qbackend.LLMConfig(group_size=32)
    with pytest.raises(ValueError, match="group_size must be one of 16, 32, 64, 128, 256, got 100"):
        qbackend.LLMConfig(weights="int4", group_size=100)
    with pytest.raises(TypeError, match="symmetric must be True or False"):
        qbackend.LLMConfig(weights="int4", symmetric="yes")
    assert (qbackend.LLMConfig(weights="int4").group_size, qbackend.LLMConfig(weights="int4").symmetric) == (32, False)


def test_int4_with_int8_activations():
    """W4A8: every Linear runs woq4a8_linear; the logits stay close to the float-activation int4 model's
    (the activations' 8-bit rounding on top of the weights' 4-bit one)."""
    from qbackend.nn import Int4WeightOnlyLinear

    model, model_a8 = _llama(), _llama()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    qbackend.quantize_llm(model, qbackend.LLMConfig(weights="int4"))
    qbackend.quantize_llm(model_a8, qbackend.LLMConfig(weights="int4", activations="int8"))
    assert model_a8.qbackend_llm["activations"] == "int8"
    int4 = [m for m in model_a8.modules() if isinstance(m, Int4WeightOnlyLinear)]  # fused groups' too
    assert len(int4) == 2 * 4 and all(m.activations == "int8" for m in int4)  # per layer: q|k|v, o, gate|up, down
    with torch.no_grad():
        out, out_a8 = model(ids).logits, model_a8(ids).logits
    assert _sqnr(out, out_a8) > 25 and _sqnr(ref, out_a8) > 12
    assert not torch.equal(out, out_a8)
    assert model_a8.generate(ids[:1], max_new_tokens=4, do_sample=False).shape == (1, 16)


def test_activation_settings_are_checked():
    assert qbackend.LLMConfig(activations="int8").activations == "int8"  # W8A8
    with pytest.raises(ValueError, match="activations must be one of float, int8, got 'int4'"):
        qbackend.LLMConfig(weights="int4", activations="int4")


def test_output_projection_int8_unless_asked_for_int4():
    """With 4-bit weights the output projection stays at 8 bits by default (llama.cpp's choice too);
    lm_head='int4' takes it to 4 bits, with the same groups as the other Linears."""
    from qbackend.nn import Int4WeightOnlyLinear

    model = qbackend.quantize_llm(_llama(tie=False), qbackend.LLMConfig(weights="int4"))
    assert type(model.lm_head) is WeightOnlyLinear
    assert isinstance(model.model.layers[0].self_attn.o_proj, Int4WeightOnlyLinear)
    model4 = qbackend.quantize_llm(_llama(tie=False), qbackend.LLMConfig(weights="int4", lm_head="int4", group_size=64))
    assert isinstance(model4.lm_head, Int4WeightOnlyLinear) and model4.lm_head.group_size == 64
    assert type(qbackend.quantize_llm(_llama(), qbackend.LLMConfig(lm_head="int8")).lm_head) is WeightOnlyLinear
    with pytest.raises(ValueError, match="lm_head='int4' needs weights='int4'"):
        qbackend.LLMConfig(lm_head="int4")
    for bad in ("fp16", 1, None):
        with pytest.raises(ValueError, match="lm_head must be True, False, 'int8' or 'int4'"):
            qbackend.LLMConfig(lm_head=bad)


@pytest.mark.parametrize("config", [dict(), dict(weights="int4", activations="int8")])
def test_sampling_beam_search_and_static_cache(config):
    """generate's other modes run on the quantized model: sampling, beam search (the cache reordered
    between steps) and the static cache (the same greedy tokens as the dynamic one)."""
    model = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(**config))
    ids = _ids(1, 9)
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=5, do_sample=True, top_k=20)
    beams = model.generate(ids, max_new_tokens=5, do_sample=False, num_beams=3)
    assert sampled.shape == beams.shape == (1, 14) and torch.equal(beams[:, :9], ids)
    greedy = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static"), greedy)


@pytest.mark.parametrize("bits", ["int8", "int4"])
def test_input_embedding_rows_quantized_on_request(bits):
    """LLMConfig(embedding=...) stores the input embedding's rows quantized (QuantizedEmbedding): the
    looked-up rows are the table's rowwise rounding, the logits stay close, generate runs; skipped or
    non-float32 tables stay float, and the default keeps it float."""
    from qbackend.nn import QuantizedEmbedding

    ids = _ids()
    plain = qbackend.quantize_llm(_llama())
    assert plain.qbackend_llm["embedding"] is None and type(plain.model.embed_tokens) is nn.Embedding
    model = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(embedding=bits))
    emb = model.model.embed_tokens
    assert isinstance(emb, QuantizedEmbedding) and model.qbackend_llm["embedding"] == "model.embed_tokens"
    assert model.get_input_embeddings() is emb and len(model.qbackend_llm["native_layers"]) == 2
    ref = _llama().model.embed_tokens.weight.detach()
    rows = emb(torch.arange(300))
    step = (ref.amax(1) - ref.amin(1)) / (255 if bits == "int8" else 15)
    assert bool(((rows - ref).abs() <= step[:, None] * 0.51 + 1e-6).all())  # within half a level (fp16 qparams)
    with torch.no_grad():
        assert _sqnr(plain(ids).logits, model(ids).logits) > (30 if bits == "int8" else 15)
    assert model.generate(ids[:1], max_new_tokens=4, do_sample=False).shape == (1, 16)
    skipped = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(embedding=bits, skip=("model.embed_tokens",)))
    assert skipped.qbackend_llm["embedding"] is None
    bf16 = qbackend.quantize_llm(_llama().to(torch.bfloat16), qbackend.LLMConfig(embedding=bits))
    assert bf16.qbackend_llm["embedding"] is None and type(bf16.model.embed_tokens) is nn.Embedding
    with pytest.raises(ValueError, match="embedding must be 'int8', 'int4' or False"):
        qbackend.LLMConfig(embedding="fp8")
