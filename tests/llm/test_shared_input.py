"""quantize_llm's fusion of the Linears that read the same input (qbackend.llm.shared_input): the
groups found on a probe (q, k, v and gate, up per layer), outputs equal to the unfused model's, every
member still a module at its place, out-of-order and concurrent calls correct, inference mode, and a
model whose code cannot take the slices left unfused."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import qbackend
from qbackend.llm.shared_input import SharedInputLinear

transformers = pytest.importorskip("transformers")


def _llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def _ids(n=2, t=12, seed=1):
    return torch.randint(0, 300, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", [dict(), dict(weights="int4"), dict(weights="int4", activations="int8")])
def test_groups_and_same_outputs(config):
    plain = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(fuse_projections=False, **config))
    fused = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(**config))
    layers = [f"model.layers.{i}" for i in range(2)]
    assert fused.qbackend_llm["fused"] == [g for layer in layers for g in
                                           ([f"{layer}.self_attn.{p}_proj" for p in "qkv"],
                                            [f"{layer}.mlp.gate_proj", f"{layer}.mlp.up_proj"])]
    k = fused.model.layers[0].self_attn.k_proj
    assert isinstance(k, SharedInputLinear) and (k.in_features, k.out_features) == (64, 32)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, plain(ids).logits, rtol=1e-5, atol=1e-6)
        x = torch.randn(3, 64)
        for p in "qkv":  # called alone, out of order: each member's own product
            torch.testing.assert_close(getattr(fused.model.layers[1].self_attn, f"{p}_proj")(x),
                                       getattr(plain.model.layers[1].self_attn, f"{p}_proj")(x), rtol=1e-5, atol=1e-6)
    assert torch.equal(fused.generate(ids[:1], max_new_tokens=5, do_sample=False),
                       plain.generate(ids[:1], max_new_tokens=5, do_sample=False))


def test_in_place_change_of_the_input_is_seen():
    fused = qbackend.quantize_llm(_llama())
    plain = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(fuse_projections=False))
    attn, ref = fused.model.layers[0].self_attn, plain.model.layers[0].self_attn
    x = torch.randn(2, 64)
    with torch.no_grad():
        attn.q_proj(x)
        x.mul_(2)  # k_proj must not take the slice computed before the change
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x), rtol=1e-5, atol=1e-6)


def test_inference_mode_and_concurrent_forwards():
    fused = qbackend.quantize_llm(_llama())
    plain = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(fuse_projections=False))
    batches = [_ids(1, 9, seed=s) for s in range(4)]
    with torch.no_grad():
        refs = [plain(b).logits for b in batches]
    with torch.inference_mode():
        torch.testing.assert_close(fused(batches[0]).logits, refs[0], rtol=1e-5, atol=1e-6)
    outs = [None] * 4

    def work(i):
        with torch.no_grad():
            for _ in range(3):
                outs[i] = fused(batches[i]).logits

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


class FlatQ(nn.Module):
    """Reads q, k and v from one input but flattens q, which a column slice of a fused product refuses."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": 50})()
        self.embed = nn.Embedding(50, 16)
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, input_ids, use_cache=False):
        h = self.embed(input_ids)
        q = self.q(h).view(-1)
        return (self.head(self.k(h) * self.v(h) + q.reshape(h.shape)),)


def test_a_model_that_cannot_take_slices_stays_unfused():
    model = qbackend.quantize_llm(FlatQ())
    assert model.qbackend_llm["fused"] == [] and not isinstance(model.q, SharedInputLinear)
    ids = torch.arange(6).reshape(1, 6)
    with torch.no_grad():
        assert model(ids)[0].shape == (1, 6, 50)


def test_deepcopy_and_pickle():
    import copy
    import io

    fused = qbackend.quantize_llm(_llama())
    ids = _ids()
    with torch.no_grad():
        ref = fused(ids).logits
        dup = copy.deepcopy(fused)
        torch.testing.assert_close(dup(ids).logits, ref, rtol=0, atol=0)
        q = dup.model.layers[0].self_attn.q_proj
        assert q._group.fused is q.fused and q.fused is not fused.model.layers[0].self_attn.q_proj.fused
        buf = io.BytesIO()
        torch.save(fused, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        torch.testing.assert_close(loaded(ids).logits, ref, rtol=0, atol=0)
