"""The decoding step in one Python call (qbackend.llm.decoding_step): a model whose decoder layers are all
native gets it (its stack keeps its class as a base, its attributes and state_dict keys), its steps
give the model's own step's logits and cache bit for bit (greedy, sampled, beam search, batches, every
scheme), it steps aside wherever a condition fails (padding, a hook, hidden states asked for, a cache
other than a DynamicCache, a replaced layer; a model with a sliding window keeps its own step), and copies,
pickles and reloads keep it."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import qbackend
from qbackend.llm.decoding_step import NativeDecodingStep, remove_decoding_step
from qbackend.llm.kv_cache import Int8KVCache

transformers = pytest.importorskip("transformers")

_SCHEMES = [dict(), dict(activations="int8"), dict(weights="int4"), dict(weights="int4", activations="int8")]


def _config(kind="llama", **extra):
    args = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaConfig(**args, **extra), transformers.LlamaForCausalLM
    if kind == "qwen2":
        return transformers.Qwen2Config(**args, **extra), transformers.Qwen2ForCausalLM
    return transformers.MistralConfig(**args, **extra), transformers.MistralForCausalLM


def _pair(config=None, kind="llama", **extra):
    """The same quantized model with and without the decoding step."""
    cfg, cls = _config(kind, **extra)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(qbackend.quantize_llm(cls(cfg).eval(), qbackend.LLMConfig(**(config or {}))))
    fast, own = models
    assert fast.qbackend_llm["decoding_step"] == "model" and remove_decoding_step(own) == "model"
    assert isinstance(fast.model, NativeDecodingStep) and not isinstance(own.model, NativeDecodingStep)
    return fast, own


class _Taken:
    """Counts the steps the decoding step ran on `model`."""

    def __init__(self, model):
        self.stack, self.count = model.model, 0

    def __enter__(self):
        def counted(input_ids, kwargs):
            out = NativeDecodingStep._decoding_step(self.stack, input_ids, kwargs)
            self.count += out is not None
            return out
        self.stack.__dict__["_decoding_step"] = counted
        return self

    def __exit__(self, *exc):
        self.stack.__dict__.pop("_decoding_step")


def _ids(n=1, t=7, seed=1):
    return torch.randint(0, 300, (n, t), generator=torch.Generator().manual_seed(seed))


def _steps(model, ids, n=5, **kwargs):
    """Logits of a prompt and n greedy steps, and the cache's rows."""
    cache = transformers.DynamicCache()
    with torch.no_grad():
        out = [model(ids, past_key_values=cache, use_cache=True, **kwargs).logits]
        for _ in range(n):
            out.append(model(out[-1][:, -1:].argmax(-1), past_key_values=cache, use_cache=True).logits)
    return out + [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("config", _SCHEMES)
def test_steps_equal_the_models_own(config):
    fast, own = _pair(config)
    assert isinstance(fast.model, transformers.LlamaModel) and type(fast.model).__name__ == "NativeStepLlamaModel"
    assert list(fast.state_dict()) == list(own.state_dict())
    ids = _ids(2)
    with _Taken(fast) as taken:
        got = _steps(fast, ids, n=70)  # past the storage's first capacity (64): the step grows it on the model's path
    assert 60 <= taken.count < 70
    assert all(map(torch.equal, got, _steps(own, ids, n=70)))
    with _Taken(fast) as taken:
        greedy = fast.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert taken.count == 7
    assert torch.equal(greedy, own.generate(ids[:1], max_new_tokens=8, do_sample=False))


def test_sampling_beams_and_batches():
    fast, own = _pair(dict(weights="int4", activations="int8"))
    ids = _ids(3, 6)
    for kwargs in (dict(do_sample=True, top_k=20), dict(num_beams=3, do_sample=False), dict(do_sample=False)):
        torch.manual_seed(4)
        with _Taken(fast) as taken:
            a = fast.generate(ids, max_new_tokens=6, **kwargs)
        torch.manual_seed(4)
        assert torch.equal(a, own.generate(ids, max_new_tokens=6, **kwargs)), kwargs
        assert taken.count == 5 or "num_beams" in kwargs  # beam search reorders the cache: the model's path


def test_steps_aside_where_a_condition_fails():
    fast, own = _pair()
    ids = _ids(2, 6)
    # a padded batch: the mask has zeros
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with _Taken(fast) as taken:
        a = fast.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert taken.count == 0 and torch.equal(a, own.generate(ids, attention_mask=mask, max_new_tokens=5,
                                                             do_sample=False))
    # a forward hook on a layer is called
    seen = []
    handle = fast.model.layers[1].register_forward_hook(lambda m, i, o: seen.append(1))
    with _Taken(fast) as taken:
        a = fast.generate(ids[:1], max_new_tokens=4, do_sample=False)
    handle.remove()
    assert taken.count == 0 and len(seen) == 4 and torch.equal(a, own.generate(ids[:1], max_new_tokens=4,
                                                                                  do_sample=False))
    # a static cache, the int8 KV cache
    for kwargs in (dict(cache_implementation="static"), dict(past_key_values=Int8KVCache())):
        with _Taken(fast) as taken:
            a = fast.generate(ids[:1], max_new_tokens=4, do_sample=False, **kwargs)
        kwargs = {k: (Int8KVCache() if k == "past_key_values" else v) for k, v in kwargs.items()}
        assert taken.count == 0 and torch.equal(a, own.generate(ids[:1], max_new_tokens=4, do_sample=False,
                                                                **kwargs))
    # hidden states asked for: the model's forward, which records them; later steps take the decoding step
    cache, cache_own = transformers.DynamicCache(), transformers.DynamicCache()
    with torch.no_grad(), _Taken(fast) as taken:
        fast(ids, past_key_values=cache, use_cache=True)
        own(ids, past_key_values=cache_own, use_cache=True)
        out = fast(ids[:, :1], past_key_values=cache, use_cache=True, output_hidden_states=True)
        ref = own(ids[:, :1], past_key_values=cache_own, use_cache=True, output_hidden_states=True)
        assert taken.count == 0 and len(out.hidden_states) == 3
        assert all(map(torch.equal, out.hidden_states, ref.hidden_states))
        assert torch.equal(fast(ids[:, 1:2], past_key_values=cache, use_cache=True).logits,
                           own(ids[:, 1:2], past_key_values=cache_own, use_cache=True).logits)
        assert taken.count == 1
    # a step of another batch size than the cache's: the model's forward (and its error), no row written
    cache = transformers.DynamicCache()
    with torch.no_grad(), _Taken(fast) as taken:
        fast(ids, past_key_values=cache, use_cache=True)
        held = [(layer.keys.clone(), layer.keys.shape) for layer in cache.layers]
        with pytest.raises(Exception):
            fast(ids[:1, :1], past_key_values=cache, use_cache=True)
    assert taken.count == 0
    assert all(torch.equal(layer.keys[:, :, :shape[2]], k) for layer, (k, shape) in zip(cache.layers, held))
    # a layer replaced by one of another class: the model's forward, on the new layer
    layer = fast.model.layers[0]
    plain = transformers.models.llama.modeling_llama.LlamaDecoderLayer(fast.config, 0).eval()
    fast.model.layers[0], own.model.layers[0] = copy.deepcopy(plain), copy.deepcopy(plain)
    with _Taken(fast) as taken:
        got = _steps(fast, ids)
    assert taken.count == 0 and all(map(torch.equal, got, _steps(own, ids)))
    fast.model.layers[0] = layer


def test_sliding_window_and_qwen2():
    """Mistral with a sliding window (whose mask the model's own step builds) keeps the model's step (the
    probe's steps do not take the decoding step); without one, and Qwen2's stack, take it."""
    cfg, cls = _config("mistral", sliding_window=8)
    torch.manual_seed(0)
    model = qbackend.quantize_llm(cls(cfg).eval())
    assert model.qbackend_llm["decoding_step"] is None and type(model.model) is transformers.MistralModel
    assert len(model.qbackend_llm["native_layers"]) == 2
    ids = _ids(1, 4)
    for kind, base in (("mistral", transformers.MistralModel), ("qwen2", transformers.Qwen2Model)):
        fast, own = _pair(kind=kind, **({"sliding_window": None} if kind == "mistral" else {}))
        assert isinstance(fast.model, base)
        with _Taken(fast) as taken:
            got = _steps(fast, ids)
        assert taken.count == 5 and all(map(torch.equal, got, _steps(own, ids)))


def test_copies_and_pickles_keep_it():
    fast, own = _pair(dict(weights="int4"))
    ids = _ids(1, 5)
    ref = _steps(own, ids)
    for other in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        assert type(other.model) is type(fast.model) and other.model is not fast.model
        with _Taken(other) as taken:
            got = _steps(other, ids)
        assert taken.count == 5 and all(map(torch.equal, got, ref))


def test_models_without_native_layers_keep_their_class():
    cfg, cls = _config()
    torch.manual_seed(0)
    model = qbackend.quantize_llm(cls(cfg).eval(), qbackend.LLMConfig(native_layers=False))
    assert model.qbackend_llm["decoding_step"] is None and type(model.model) is transformers.LlamaModel
    assert remove_decoding_step(model) is None
