"""Native decoder layers (qbackend.llm.decoder_layers, csrc/runtime/decoder_layer.cpp): a quantized,
fused Llama-style layer computed in native calls (one per step where it writes the DynamicCache's rows
itself, two around the cache's update otherwise) gives the module path's outputs bit for bit
(prefill, greedy and sampled decoding, beam search, padded batches, the static cache, GQA and
multi-head attention, biases), matches an fp64 computation of the layer, falls back to the model's
own code where it does not apply, sees replaced children, survives copies, leaves other layer forms
alone, and refuses bad arguments with errors naming them."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import qbackend
from qbackend.core.extension import _C
from qbackend.llm.decoder_layers import NativeDecoderLayer
from qbackend.nn import WeightOnlyLinear

from .isa_children import decoding_attention_caps, isa_capped

transformers = pytest.importorskip("transformers")

_SCHEMES = [dict(), dict(activations="int8"), dict(weights="int4"), dict(weights="int4", activations="int8")]


def _llama(seed=0, kv_heads=2, bias=False, layers=2, head_dim=None):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                                   attention_bias=bias, mlp_bias=bias, head_dim=head_dim)
    return transformers.LlamaForCausalLM(cfg).eval()


def _pair(config=None, **model_args):
    """The same model quantized with and without native layers."""
    config = config or {}
    plain = qbackend.quantize_llm(_llama(**model_args), qbackend.LLMConfig(native_layers=False, **config))
    native = qbackend.quantize_llm(_llama(**model_args), qbackend.LLMConfig(**config))
    return plain, native


def _ids(n=2, t=12, seed=1):
    return torch.randint(0, 300, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", _SCHEMES)
def test_prefill_and_decoding_equal_the_module_path(config):
    plain, native = _pair(config)
    assert native.qbackend_llm["native_layers"] == ["model.layers.0", "model.layers.1"]
    assert plain.qbackend_llm["native_layers"] == []
    layer = native.model.layers[1]
    assert isinstance(layer, NativeDecoderLayer) and layer.self_attn.k_proj is native.model.layers[1].self_attn.k_proj
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(native(ids).logits, plain(ids).logits)
    greedy = native.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert torch.equal(greedy, plain.generate(ids[:1], max_new_tokens=8, do_sample=False))
    assert torch.equal(native.generate(ids[:1], max_new_tokens=8, do_sample=False, cache_implementation="static"),
                       greedy)


def test_layers_keep_their_class_and_record_hidden_states():
    """A native layer is the model's own layer object, an instance of its class: transformers' output
    capturing records its outputs (the module path's bits), and the stack's own class sees them too."""
    plain, native = _pair(dict(weights="int4", activations="int8"))
    layer = native.model.layers[0]
    assert isinstance(layer, transformers.models.llama.modeling_llama.LlamaDecoderLayer)
    assert type(layer).__name__ == "NativeLlamaDecoderLayer" and "native: heads=4" in repr(layer)
    assert list(native.state_dict()) == list(plain.state_dict())
    ids = _ids()
    with torch.no_grad():
        out, ref = native(ids, output_hidden_states=True), plain(ids, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and all(map(torch.equal, out.hidden_states, ref.hidden_states))


@pytest.mark.parametrize("model_args", [dict(kv_heads=4), dict(kv_heads=1), dict(bias=True)])
def test_attention_forms_and_biases(model_args):
    """Multi-head (no GQA), one key head (4 queries per key), and biases on every projection."""
    plain, native = _pair(**model_args)
    assert len(native.qbackend_llm["native_layers"]) == 2
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(native(ids).logits, plain(ids).logits)
    assert torch.equal(native.generate(ids[:1], max_new_tokens=6, do_sample=False),
                       plain.generate(ids[:1], max_new_tokens=6, do_sample=False))


def test_padded_batch_sampling_and_beam_search():
    """A left-padded batch (a mask in every step, queries packed by key head), sampling and beam search
    (the cache reordered between steps): the same tokens as the module path."""
    plain, native = _pair(dict(weights="int4", activations="int8"))
    ids = _ids(3, 10)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :1] = 0
    runs = [dict(do_sample=False), dict(do_sample=False, num_beams=3), dict(do_sample=True, top_k=20)]
    for kwargs in runs:
        out = []
        for model in (plain, native):
            torch.manual_seed(0)
            out.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, **kwargs))
        assert torch.equal(out[0], out[1]), kwargs


def _dequantized(m) -> torch.Tensor:
    return (m.weight_int8.double() * m.w_scales.double().reshape(-1, 1))


@pytest.mark.parametrize("L,cached,head_dim,kv_heads", [(5, 0, 16, 2), (1, 7, 16, 2), (1, 40, 24, 1), (1, 1, 16, 4),
                                                          (1, 9, 20, 2), (3, 6, 16, 2)])
def test_layer_matches_fp64_reference(L, cached, head_dim, kv_heads):
    """One native layer (int8 weights, float activations) against the layer computed in float64 from the
    dequantized weights: rotary embedding, GQA attention (causal over a prompt, or one new position over
    `cached` earlier ones: the decoding kernel), SiLU-gated MLP, residuals."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim)
    model = qbackend.quantize_llm(transformers.LlamaForCausalLM(cfg).eval())
    layer = model.model.layers[0]
    assert isinstance(layer, NativeDecoderLayer)
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.q_proj.fused, mlp.gate_proj.fused
    gen = torch.Generator().manual_seed(3)
    B, D, H, KV = 2, head_dim, 4, kv_heads
    hidden = torch.randn(B, L, 64, generator=gen)
    angles = torch.randn(B, L, D // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    past_k, past_v = torch.randn(B, KV, cached, D, generator=gen), torch.randn(B, KV, cached, D, generator=gen)
    native = layer._current()
    outs = []
    # a decoding step on each decoding kernel (on AVX512 CPUs the AVX2 one too); a prompt on SDPA
    for cap in decoding_attention_caps().values() if L == 1 and cached else [_C.isa_cap()]:
        with torch.no_grad(), isa_capped(cap):
            q, k, v = native.attention_inputs(hidden, cos, sin)
            outs.append(native.finish(hidden, q, torch.cat([past_k, k], 2), torch.cat([past_v, v], 2), None))

    def norm(x, m):
        return m.weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)

    def rope(t):  # [B, heads, L, D]
        c, s = cos.double()[:, None], sin.double()[:, None]
        return t * c + torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1) * s

    h = hidden.double()
    p = norm(h, layer.input_layernorm) @ _dequantized(qkv).T
    q = rope(p[..., :H * D].reshape(B, L, H, D).transpose(1, 2))
    k = rope(p[..., H * D:(H + KV) * D].reshape(B, L, KV, D).transpose(1, 2))
    v = p[..., (H + KV) * D:].reshape(B, L, KV, D).transpose(1, 2)
    k = torch.cat([past_k.double(), k], 2).repeat_interleave(H // KV, 1)
    v = torch.cat([past_v.double(), v], 2).repeat_interleave(H // KV, 1)
    scores = (q @ k.transpose(-1, -2)) * D ** -0.5
    if L > 1 and not cached:
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    if L > 1 and cached:  # no mask with a prompt after a cache: SDPA's causal mask is top-left aligned
        scores = scores.masked_fill(torch.ones(L, cached + L, dtype=torch.bool).triu(1), float("-inf"))
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * D)
    h = h + a @ _dequantized(attn.o_proj).T
    g = norm(h, layer.post_attention_layernorm) @ _dequantized(gate_up).T
    ref = h + (torch.nn.functional.silu(g[..., :160]) * g[..., 160:]) @ _dequantized(mlp.down_proj).T
    for out in outs:
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_decoding_attention_matches_sdpa():
    """The decoding kernel (one position, no mask) against SDPA (the same step with an all-true mask),
    over cache lengths that straddle its 8- and 16-lane blocks, key-head sharing from 1 to 4 queries and
    head sizes of one vector to more than one pass of its value vectors (136: 64 + 64 + 8 lanes): this
    CPU's kernel, and on AVX512 CPUs the AVX2 one too."""
    for kernel, cap in decoding_attention_caps().items():
        with isa_capped(cap):
            assert _C.decode_attention_isa() == kernel
            for kv_heads, D in ((4, 16), (2, 16), (1, 16), (2, 136), (1, 40)):
                _, native = _pair(kv_heads=kv_heads, head_dim=None if D == 16 else D)
                layer = native.model.layers[0]._current()
                gen = torch.Generator().manual_seed(kv_heads)
                for S in (1, 7, 8, 9, 15, 16, 17, 100):
                    hidden = torch.randn(3, 1, 64, generator=gen)
                    q = torch.randn(3, 4, 1, D, generator=gen)
                    k, v = (torch.randn(3, kv_heads, S, D, generator=gen) * 3 for _ in range(2))
                    with torch.no_grad():
                        fast = layer.finish(hidden, q, k, v, None)
                        ref = layer.finish(hidden, q, k, v, torch.ones(3, 1, 1, S, dtype=torch.bool))
                    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)


def test_falls_back_to_the_model_code_where_native_does_not_apply():
    plain, native = _pair()
    ids = _ids()
    calls = []
    native.model.layers[0]._current = lambda: calls.append(1) or NativeDecoderLayer._current(native.model.layers[0])
    with torch.no_grad():
        native(ids)
        assert calls, "the native path ran"
        calls.clear()
        for model in (plain, native):  # the eager attention: the model's code, same logits
            model.set_attn_implementation("eager")
        assert torch.equal(native(ids).logits, plain(ids).logits) and not calls
        for model in (plain, native):
            model.set_attn_implementation("sdpa")
        native.train()
        plain.train()
        assert torch.equal(native(ids).logits, plain(ids).logits) and not calls
        native.eval()
        plain.eval()
        native.to(torch.bfloat16)
        plain.to(torch.bfloat16)
        assert torch.equal(native(ids).logits, plain(ids).logits) and not calls


def test_replaced_children_are_seen():
    plain, native = _pair()
    gen = torch.Generator().manual_seed(5)
    replacement = torch.nn.Linear(160, 64)
    torch.nn.init.normal_(replacement.weight, generator=gen)
    ids = _ids()
    with torch.no_grad():
        native(ids)  # builds the native layers
        for model in (plain, native):
            model.model.layers[1].mlp.down_proj = WeightOnlyLinear.from_float(replacement)
        assert torch.equal(native(ids).logits, plain(ids).logits)
        for model in (plain, native):
            model.model.layers[0].input_layernorm.weight.mul_(2)  # in place: the native layer reads it
        assert torch.equal(native(ids).logits, plain(ids).logits)


def test_copies_and_pickles_rebuild_the_native_layers():
    _, native = _pair(dict(weights="int4"))
    ids = _ids()
    with torch.no_grad():
        ref = native(ids).logits
        for other in (copy.deepcopy(native), pickle.loads(pickle.dumps(native))):
            assert isinstance(other.model.layers[0], NativeDecoderLayer)
            assert torch.equal(other(ids).logits, ref)
    with torch.inference_mode():
        assert torch.equal(native(ids).logits, ref)


def test_other_layer_forms_keep_the_model_code():
    """Qwen3's layers (norms on q and k) are not of the native form; with native_layers off or without
    fused projections nothing is swapped."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=128)
    qwen3 = qbackend.quantize_llm(transformers.Qwen3ForCausalLM(cfg).eval())
    assert qwen3.qbackend_llm["native_layers"] == [] and qwen3.qbackend_llm["fused"]
    unfused = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(fuse_projections=False))
    assert unfused.qbackend_llm["native_layers"] == []


def test_qwen2_layers_are_native():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    plain = qbackend.quantize_llm(transformers.Qwen2ForCausalLM(cfg).eval(), qbackend.LLMConfig(native_layers=False))
    torch.manual_seed(0)
    native = qbackend.quantize_llm(transformers.Qwen2ForCausalLM(cfg).eval())
    assert len(native.qbackend_llm["native_layers"]) == 2
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(native(ids).logits, plain(ids).logits)


def _args(layer):
    from qbackend.llm.decoder_layers import _product
    a, m = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    return dict(norm1=n1.weight, eps1=n1.eps, qkv=_product(a.q_proj.fused), o=_product(a.o_proj), norm2=n2.weight,
                eps2=n2.eps, gate_up=_product(m.gate_proj.fused), down=_product(m.down_proj), heads=4, kv_heads=2,
                head_dim=16, scaling=0.25)


def test_bad_arguments_are_errors_naming_them():
    _, native = _pair()
    args = _args(native.model.layers[0])
    layer = _C.DecoderLayer(**args)
    with pytest.raises(ValueError, match="heads"):
        _C.DecoderLayer(**{**args, "heads": 3})
    with pytest.raises(ValueError, match="head_dim"):
        _C.DecoderLayer(**{**args, "head_dim": 15})
    with pytest.raises(ValueError, match="o must map"):
        _C.DecoderLayer(**{**args, "o": args["down"]})
    with pytest.raises(ValueError, match="kind must be"):
        _C.DecoderLayer(**{**args, "qkv": ("int2",) + args["qkv"][1:]})
    cos = torch.ones(1, 3, 16)
    with pytest.raises(ValueError, match="hidden must have 64 features"):
        layer.attention_inputs(torch.randn(1, 3, 32), cos, cos)
    with pytest.raises(ValueError, match="hidden must be a float32"):
        layer.attention_inputs(torch.randn(1, 3, 64).double(), cos, cos)
    with pytest.raises(ValueError, match="cos must be"):
        layer.attention_inputs(torch.randn(1, 3, 64), torch.ones(1, 3, 8), cos)
    q, k, v = layer.attention_inputs(torch.randn(1, 3, 64), cos, cos)
    assert q.shape == (1, 4, 3, 16) and k.shape == v.shape == (1, 2, 3, 16)
    with pytest.raises(ValueError, match="k and v must be"):
        layer.finish(torch.randn(1, 3, 64), q, k[:, :1], v, None)
    with pytest.raises(ValueError, match="q must be"):
        layer.finish(torch.randn(1, 3, 64), k, k, v, None)


@pytest.mark.parametrize("L,pos", [(1, 0), (1, 9), (4, 5)])
def test_step_equals_the_two_calls_and_the_append(L, pos):
    """step (one call: the rows written into the cache's storage) gives the bits of attention_inputs, the
    rows' append and finish, with and without a mask; the storages' rows past pos + L are untouched; an
    argument that does not fit is a ValueError naming it, raised before the storages are written."""
    _, native = _pair(dict(weights="int4", activations="int8"))
    layer = native.model.layers[0]._current()
    gen = torch.Generator().manual_seed(L + pos)
    B, KV, D, cap = 2, 2, 16, 16
    hidden = torch.randn(B, L, 64, generator=gen)
    angles = torch.randn(B, L, D // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    masks = [None, torch.rand(B, 1, L, pos + L, generator=gen) > 0.3]
    masks[1][..., -1] = True
    for mask in masks:
        key_rows, value_rows = torch.randn(B, KV, cap, D, generator=gen), torch.randn(B, KV, cap, D, generator=gen)
        before_k, before_v = key_rows.clone(), value_rows.clone()
        with torch.no_grad():
            out, keys, values = layer.step(hidden, cos, sin, key_rows, value_rows, pos, mask)
            q, k, v = layer.attention_inputs(hidden, cos, sin)
            ref_k, ref_v = torch.cat([before_k[:, :, :pos], k], 2), torch.cat([before_v[:, :, :pos], v], 2)
            ref = layer.finish(hidden, q, ref_k, ref_v, mask)
        assert torch.equal(out, ref)
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
        assert keys.data_ptr() == key_rows.data_ptr() and values.data_ptr() == value_rows.data_ptr()
        assert torch.equal(key_rows[:, :, pos + L:], before_k[:, :, pos + L:])
    rows = torch.zeros(B, KV, cap, D)
    for bad, match in (((rows, rows.clone(), cap - L + 1), "do not fit a capacity"),
                       ((rows[:, :1], rows[:, :1].clone(), 0), "key_rows must be"),
                       ((rows, rows.double(), 0), "value_rows must be"),
                       ((rows, rows[:, :, ::2], 0), "value_rows must be"),
                       ((rows, rows, 0), "two storages")):
        with pytest.raises(ValueError, match=match):
            layer.step(hidden, cos, sin, *bad, None)
        assert not rows.any()
    with pytest.raises(ValueError, match="cos must be"):
        layer.step(hidden, cos[..., :8], sin, rows, rows.clone(), 0, None)
