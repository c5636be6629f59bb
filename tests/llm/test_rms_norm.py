"""qbackend::rms_norm and qbackend.nn.RMSNorm against fp64 math, and quantize_llm's swap of a model's
RMSNorms: found by what they compute (Llama's norm is replaced, a Gemma-style `1 + weight` norm and a
LayerNorm stay), outputs equal to the model's own within float32 rounding; bad input names itself."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.llm.norms import swap_rms_norms
from qbackend.nn import RMSNorm

OP = torch.ops.qbackend.rms_norm
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("shape", [(1, 576), (3, 5, 64), (7, 1), (0, 16), (2, 3, 1000)])
def test_matches_fp64(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen) * 4
    w = torch.randn(shape[-1], generator=gen)
    y = OP(x, w, 1e-6)
    xd = x.double()
    ref = w.double() * (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert y.shape == x.shape and y.dtype == torch.float32
    # float32: the normalizer's rounding, two products
    torch.testing.assert_close(y.double(), ref, rtol=4 * 2 ** -24, atol=1e-30)


def test_module_other_dtypes_and_export():
    w = torch.randn(32)
    norm = RMSNorm(w, 1e-5)
    x = torch.randn(4, 32)
    torch.testing.assert_close(norm(x), OP(x, w, 1e-5), rtol=0, atol=0)
    xb = x.bfloat16()
    hb = xb.float()
    ref = w * (hb * torch.rsqrt(hb.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    torch.testing.assert_close(norm(xb), ref, rtol=0, atol=0)
    ep = torch.export.export(norm, (x,))
    assert any("rms_norm" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), norm(x), rtol=0, atol=0)


def test_bad_arguments_name_themselves():
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(ValueError, match="weight must be 1-D with x's last dimension 8"):
        OP(x, w[:7], 1e-6)
    with pytest.raises(TypeError, match="x must have dtype torch.float32"):
        OP(x.double(), w, 1e-6)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        OP(x, w, -1.0)
    with pytest.raises(ValueError, match="weight must be a 1-D float tensor"):
        RMSNorm(torch.ones(2, 2), 1e-6)


class GemmaStyleNorm(nn.Module):
    """Scales by 1 + weight: same attributes as Llama's norm, another function."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim) * 0.1)
        self.eps = 1e-6

    def forward(self, x):
        return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_swap_finds_llama_norms_and_keeps_others():
    model = _llama()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norm weights
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    extra = nn.ModuleDict({"gemma": GemmaStyleNorm(64), "ln": nn.LayerNorm(64)})
    model.extra = extra
    swapped = swap_rms_norms(model)
    assert swapped == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                       "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
    assert all(isinstance(model.get_submodule(n), RMSNorm) for n in swapped)
    assert isinstance(model.extra.gemma, GemmaStyleNorm) and isinstance(model.extra.ln, nn.LayerNorm)
    with torch.no_grad():
        out = model(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_quantize_llm_swaps_norms_unless_told_not_to():
    model = qbackend.quantize_llm(_llama())
    assert len(model.qbackend_llm["native_norms"]) == 5
    assert isinstance(model.model.norm, RMSNorm)
    kept = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(native_norms=False))
    assert kept.qbackend_llm["native_norms"] == [] and not isinstance(kept.model.norm, RMSNorm)
    skipped = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(skip=("model.layers.1",)))
    assert "model.layers.1.input_layernorm" not in skipped.qbackend_llm["native_norms"]
    with pytest.raises(TypeError, match="native_norms must be True or False"):
        qbackend.LLMConfig(native_norms="yes")
