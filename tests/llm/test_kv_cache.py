"""Int8KVCache (qbackend/llm/kv_cache.py) and the native layers' int8 decoding attention: rows
quantized as the definition says (checked against torch's own rounding), storage that grows without
losing rows, decoding steps attended from the int8 rows equal to the same rows dequantized for SDPA,
the module path and the native one agreeing step by step, generate's modes (greedy, sampling, beam
search) running on the cache, the logits close to the float cache's, and bad arguments refused."""
from __future__ import annotations

import pytest
import torch

import qbackend
from qbackend.core.extension import _C

transformers = pytest.importorskip("transformers")
from qbackend.llm.kv_cache import Int8KVCache, Int8KVLayer  # noqa: E402

from .isa_children import decoding_attention_caps, isa_capped  # noqa: E402


def _reference_rows(x: torch.Tensor):
    """Symmetric int8 per row of x [..., D]: (values, scales) as the contract defines them."""
    scale = x.abs().amax(-1) / 127
    q = torch.where(scale[..., None] > 0, torch.round(x / scale[..., None]), torch.zeros_like(x))
    return q.clamp(-127, 127).to(torch.int8), scale


def test_rows_quantized_as_defined():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 24, generator=gen) * torch.logspace(-3, 3, 5)[:, None]
    x[0, 1, 2] = 0  # a zero row: scale 0, values 0
    x[1, 0, 3, 7] = 0.5 * x[1, 0, 3].abs().max() / 127 * 3  # an exact half step: rounds to even
    rows, scales = torch.zeros(2, 3, 9, 24, dtype=torch.int8), torch.zeros(2, 3, 9)
    _C.append_int8_rows(rows, scales, 2, x)
    ref_q, ref_s = _reference_rows(x)
    assert torch.equal(rows[:, :, 2:7], ref_q) and torch.equal(scales[:, :, 2:7], ref_s)
    assert not rows[:, :, :2].any() and not rows[:, :, 7:].any()
    nan = x.clone()
    nan[0, 0, 0, 0] = float("nan")
    _C.append_int8_rows(rows, scales, 0, nan[:, :, :1])
    assert torch.isnan(scales[0, 0, 0]) and not torch.isnan(scales[1, 0, 0])


def test_bad_rows_arguments_are_errors_naming_them():
    rows, scales, x = torch.zeros(1, 2, 4, 8, dtype=torch.int8), torch.zeros(1, 2, 4), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="do not fit a capacity of 4"):
        _C.append_int8_rows(rows, scales, 2, x)
    with pytest.raises(ValueError, match="x must be float32"):
        _C.append_int8_rows(rows, scales, 0, x.double())
    with pytest.raises(ValueError, match="rows must be contiguous int8"):
        _C.append_int8_rows(rows.float(), scales, 0, x)
    with pytest.raises(ValueError, match="scales must be contiguous float32"):
        _C.append_int8_rows(rows, torch.zeros(1, 2, 5), 0, x)


def test_layer_grows_and_keeps_every_row():
    layer, gen, parts = Int8KVLayer(), torch.Generator().manual_seed(1), []
    for n in (3, 1, 70, 1, 1, 130):
        k, v = torch.randn(2, 2, n, 16, generator=gen), torch.randn(2, 2, n, 16, generator=gen)
        keys, values = layer.update(k, v)
        parts.append((k, v))
        assert layer.get_seq_length() == layer.length == keys.shape[2] == sum(p[0].shape[2] for p in parts)
    ref_k = torch.cat([_reference_rows(k)[0].float() * _reference_rows(k)[1][..., None] for k, _ in parts], 2)
    ref_v = torch.cat([_reference_rows(v)[0].float() * _reference_rows(v)[1][..., None] for _, v in parts], 2)
    assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
    assert layer.k8.shape[2] >= layer.length
    layer.crop(-6)
    assert layer.get_seq_length() == 200
    with pytest.raises(TypeError, match="float32 CPU keys"):
        Int8KVLayer().update(k.double(), v.double())


def _llama(native=True, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256)
    return qbackend.quantize_llm(transformers.LlamaForCausalLM(cfg).eval(), qbackend.LLMConfig(native_layers=native))


def test_int8_decoding_attention_equals_dequantized_rows():
    """finish_int8 (the decoding kernel on the int8 rows) against finish on the same rows dequantized:
    this CPU's kernel, and on AVX512 CPUs the AVX2 one too."""
    for kernel, cap in decoding_attention_caps().items():
        with isa_capped(cap):
            assert _C.decode_attention_isa() == kernel
            for kv_heads in (4, 2, 1):
                layer = _llama(kv_heads=kv_heads).model.layers[0]._current()
                gen = torch.Generator().manual_seed(kv_heads)
                for S in (1, 9, 16, 33):
                    rows = Int8KVLayer()
                    rows.update(torch.randn(3, kv_heads, S, 16, generator=gen) * 2,
                                torch.randn(3, kv_heads, S, 16, generator=gen))
                    hidden, q = torch.randn(3, 1, 64, generator=gen), torch.randn(3, 4, 1, 16, generator=gen)
                    with torch.no_grad():
                        fast = layer.finish_int8(hidden, q, rows.k8, rows.k_scale, rows.v8, rows.v_scale, rows.length)
                        ref = layer.finish(hidden, q, *rows.dequantized(), torch.ones(3, 1, 1, S, dtype=torch.bool))
                    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="length must be in"):
        layer.finish_int8(hidden, q, rows.k8, rows.k_scale, rows.v8, rows.v_scale, rows.k8.shape[2] + 1)
    with pytest.raises(ValueError, match="k8 must be contiguous int8"):
        layer.finish_int8(hidden, q, rows.k8.float(), rows.k_scale, rows.v8, rows.v_scale, 1)


def _steps(model, ids, cache, steps=6):
    """Logits of a prompt and then `steps` single-token steps (the greedy tokens of `model`)."""
    out, logits = model(ids, cache=cache, use_cache=True), []
    token = out.logits[:, -1:].argmax(-1)
    logits.append(out.logits[:, -1])
    for _ in range(steps):
        out = model(token, cache=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        token = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits)


def test_native_and_module_paths_agree_on_the_int8_cache():
    native, plain = _llama(), _llama(native=False)
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = _steps(native, ids, Int8KVCache())
        b = _steps(plain, ids, Int8KVCache())
        float_cache = _steps(native, ids, transformers.DynamicCache())
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    sqnr = 10 * torch.log10(float_cache.pow(2).sum() / (a - float_cache).pow(2).sum())
    assert sqnr > 30, f"int8 KV cache logits SQNR {sqnr:.1f} dB against the float cache"


def test_generate_modes_run_on_the_int8_cache():
    model = _llama()
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(3))
    greedy = model.generate(ids, max_new_tokens=6, do_sample=False, cache=Int8KVCache())
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=6, do_sample=True, top_k=20, cache=Int8KVCache())
    beams = model.generate(ids, max_new_tokens=6, do_sample=False, num_beams=3, cache=Int8KVCache())
    assert greedy.shape == sampled.shape == beams.shape == (1, 15)
