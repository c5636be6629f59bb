"""Fused attention: the fake (meta) impl of torch.ops.qbackend.attention and the friendly wrapper
`attention`.

The op (csrc/ops/attention_ops.cpp) is torch.nn.functional.scaled_dot_product_attention without
dropout, in fp32 arithmetic (or with bf16 matrix products where the CPU has AVX512-BF16 and
`bf16_products` is set), with its output returned as float32/bfloat16 or quantized to uint8/int8
in the same pass. The output is [B, H, Sq, Dv] laid out as [B, Sq, H, Dv] in memory, so the
transpose(1, 2) + reshape a transformer does next is a view.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__ = ["ATTENTION_PROVIDERS", "AttentionProvider", "attention"]


@dataclass(frozen=True)
class AttentionProvider:
    """Who runs an attention core (torch's scaled_dot_product_attention in a captured graph)."""

    name: str
    description: str
    routed: bool = True

    def refuses(self, op: str, shape) -> str | None:
        return None if op == "attention" else f"it has no {op}"

    def exact_8bit(self, op: str | None = None, shape=None) -> bool:
        return True  # float inputs


ATTENTION_PROVIDERS: dict[str, AttentionProvider] = {
    "native": AttentionProvider("native", "qbackend::attention: scores, mask, softmax and P v in one pass per head, "
                                          "the quantize behind it fused"),
    "sdpa": AttentionProvider("sdpa", "torch's scaled_dot_product_attention, kept in the graph"),
}

_FLOATS = (torch.float32, torch.bfloat16)


@torch.library.register_fake("qbackend::attention")
def _attention_fake(q, k, v, mask, scale, is_causal=False, out_dtype=torch.float32, out_scale=1.0,
                    out_zero_point=0, bf16_products=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        torch._check_value(t.dim() == 4, lambda: f"{name} must be 4-D [batch, heads, sequence, head_dim]")
        torch._check_type(t.dtype == q.dtype and t.dtype in _FLOATS,
                          lambda: f"{name} must be float32 or bfloat16 with q's dtype")
    B, H, Sq, _ = q.shape
    return q.new_empty((B, Sq, H, v.shape[3]), dtype=out_dtype).transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, is_causal: bool = False, out_dtype: torch.dtype = torch.float32,
              out_scale: float = 1.0, out_zero_point: int = 0, bf16_products: bool = False) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v (scale defaults to 1 / sqrt(head_dim), as in torch's SDPA);
    uint8/int8 out_dtype quantizes with (out_scale, out_zero_point)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.ops.qbackend.attention(q, k, v, mask, float(scale), bool(is_causal), out_dtype, float(out_scale),
                                        int(out_zero_point), bool(bf16_products))
