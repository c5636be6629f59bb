"""The LayerNorm pass of convert: a LayerNorm over the last dimension whose output is quantized by
a Quantize border (the int8 input of the next Linears) becomes one LayerNormQuantize call
(qbackend::layer_norm_quantize, csrc/kernels/layer_norm_avx512.cpp) giving both the float output
and the int8 one; a residual add that only feeds the LayerNorm (post-LN blocks: dense output +
residual; BERT's embeddings: token sum + position embeddings broadcast over the batch) is folded in too. One pass over the rows instead of three ops (add, layer_norm, quantize).
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from ..nn.layer_norm import LayerNormQuantize
from ..nn.quant import Quantize
from ..ops.layer_norm import residual_broadcasts
from .fold import get_attr_value
from .graph_utils import bound_args, module_of, node_value

aten = torch.ops.aten
_ARGS = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")


def _float32(arg, shape) -> bool:
    v = node_value(arg)
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32 and tuple(v.shape) == tuple(shape)


def _is_vector(gm: fx.GraphModule, node, n: int) -> bool:
    """node is a float32 [n] value (a parameter's get_attr, with or without recorded metadata)."""
    t = node_value(node)
    if t is None and isinstance(node, fx.Node) and node.op == "get_attr":
        t = get_attr_value(gm, node)
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and tuple(t.shape) == (n,)


def _leading_broadcast(arg, shape) -> bool:
    """arg is a float32 value the fused op can add as the residual of an x of `shape`."""
    v = node_value(arg)
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32 and residual_broadcasts(v.shape, shape)


def _residual(x: fx.Node, shape) -> tuple[fx.Node, fx.Node] | None:
    """(a, b) when x = a + b, a plain float32 add read only here, a of x's shape and b of it or
    broadcasting over leading dimensions (fp32 addition commutes, so either operand may be b)."""
    if not (isinstance(x, fx.Node) and x.op == "call_function" and x.target is aten.add.Tensor
            and len(x.users) == 1 and len(x.args) == 2 and not x.kwargs):
        return None
    a, b = x.args
    if _float32(a, shape) and _leading_broadcast(b, shape):
        return a, b
    if _float32(b, shape) and _leading_broadcast(a, shape):
        return b, a
    return None


def fuse_layer_norms(gm: fx.GraphModule) -> int:
    """Rewrite the eligible LayerNorm + Quantize pairs of gm in place; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.layer_norm.default:
            continue
        a = bound_args(node, _ARGS)
        val = node_value(node)
        shape = a.get("normalized_shape")
        if not (isinstance(val, torch.Tensor) and val.dtype == torch.float32 and isinstance(shape, (list, tuple))
                and len(shape) == 1 and isinstance(shape[0], int) and val.shape[-1] == shape[0]):
            continue
        if not all(w is None or _is_vector(gm, w, shape[0]) for w in (a.get("weight"), a.get("bias"))):
            continue
        quants = [u for u in node.users if module_of(gm, u, Quantize) is not None]
        if len(quants) != 1:
            continue
        qnode, qmod = quants[0], module_of(gm, quants[0], Quantize)
        x, residual = a["input"], None
        pair = _residual(x, val.shape)
        if pair is not None:
            x, residual = pair
        elif not _float32(x, val.shape):
            continue
        module = LayerNormQuantize(shape[0], a.get("eps", 1e-5), qmod.scale, qmod.zero_point, qmod.dtype, qmod.qmax,
                                   qmod.value, qmod.channel_divisor)
        name = f"qbackend_layer_norm_quantize_{count}"
        gm.add_submodule(name, module)
        with gm.graph.inserting_after(node):
            call = gm.graph.call_module(name, (x, residual, a.get("weight"), a.get("bias")))
        with gm.graph.inserting_after(call):
            y = gm.graph.call_function(operator.getitem, (call, 0))
        y.meta["val"] = val  # the LayerNorm's float output (a later LayerNorm's residual check reads it)
        with gm.graph.inserting_after(y):
            q = gm.graph.call_function(operator.getitem, (call, 1))
        qnode.replace_all_uses_with(q)
        gm.graph.erase_node(qnode)
        node.replace_all_uses_with(y)
        add = a["input"]
        gm.graph.erase_node(node)
        if residual is not None:
            gm.graph.erase_node(add)
        count += 1
    return count
