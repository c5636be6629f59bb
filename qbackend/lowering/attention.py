"""The attention-core pass of convert: each torch scaled_dot_product_attention left in the graph
becomes a FusedAttention module (qbackend::attention, csrc/kernels/attention_avx512*.cpp), and a
Quantize border that is its only reader is folded into it (the kernel writes uint8 directly).
Whether it runs is routed (qbackend.dispatch.route, op "attention": provider "native" fuses,
"sdpa" keeps torch's SDPA): QuantConfig.attention "fused" / "sdpa" forces either, "auto" follows
the rule table (by default the fused kernel where this CPU's bf16 dot products pay, which is where
it was measured faster than torch's SDPA).

Taken: dropout 0, no grouped-query broadcast, 4-D float32/bfloat16 q, k, v with equal batch and
head sizes, a bool or float mask (or is_causal, not both). Anything else stays torch's SDPA.
The mask is a float input of the op, never observed or quantized.
"""
from __future__ import annotations

import torch
from torch import fx

from ..core.routes import Route
from ..dispatch import route
from ..nn.attention import FusedAttention
from ..nn.quant import Quantize
from .graph_utils import bound_args, module_of, node_value

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


# QuantConfig.attention -> the attention provider it forces (None: routed by the rules).
FORCED_BY_MODE = {"auto": None, "fused": "native", "sdpa": "sdpa"}


def attention_route(mode: str) -> Route:
    """Where the attention cores run for QuantConfig.attention `mode` on this CPU."""
    return route("attention", {}, eight_bit_input=False, forced=FORCED_BY_MODE[mode])


def _eligible(a: dict) -> bool:
    if a.get("dropout_p", 0.0) != 0.0 or a.get("enable_gqa", False):
        return False
    vals = [node_value(a.get(k)) for k in ("query", "key", "value")]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.dtype in (torch.float32, torch.bfloat16)
               for t in vals):
        return False
    q, k, v = vals
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2]:
        return False
    mask = a.get("attn_mask")
    if mask is not None:
        m = node_value(mask)
        if not isinstance(m, torch.Tensor) or m.dtype not in (torch.bool, torch.float32, torch.bfloat16):
            return False
        if a.get("is_causal", False):
            return False
    scale = a.get("scale")
    return scale is None or isinstance(scale, (int, float))


def fuse_attention(gm: fx.GraphModule, bf16_products: bool) -> int:
    """Rewrite the eligible SDPA calls of gm in place; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        a = bound_args(node, _ARGS)
        if not _eligible(a):
            continue
        readers = list(node.users)
        quant = None
        m = module_of(gm, readers[0], Quantize) if len(readers) == 1 else None
        if m is not None and m.channel_divisor is None:
            quant = (readers[0], m)
        kwargs = dict(scale=a.get("scale"), is_causal=bool(a.get("is_causal", False)), bf16_products=bf16_products,
                      out_dtype=node_value(a["query"]).dtype)  # SDPA's output dtype, unless a quantize is fused
        if quant is not None:
            m = quant[1]
            kwargs.update(out_dtype=m.dtype, out_scale=m.scale, out_zero_point=m.zero_point, qmax=m.qmax, value=m.value)
        name = f"qbackend_attention_{count}"
        gm.add_submodule(name, FusedAttention(**kwargs))
        with gm.graph.inserting_after(node):
            call = gm.graph.call_module(name, (a["query"], a["key"], a["value"], a.get("attn_mask")))
        if quant is not None:
            quant[0].replace_all_uses_with(call)
            gm.graph.erase_node(quant[0])
        else:
            call.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        count += 1
    return count
