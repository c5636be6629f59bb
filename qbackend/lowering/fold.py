"""BatchNorm folding: conv2d/linear followed by an eval-mode batch norm becomes one conv2d/linear
with scaled weights and a shifted bias (new parameters registered on the GraphModule; the
model's own parameters are never modified).

  w' = w * gamma / sqrt(var + eps)   (per output channel)
  b' = (b - mean) * gamma / sqrt(var + eps) + beta

The fold is done in float64 and stored as float32. Only a batch norm whose input is the conv's /
linear's only use is folded (otherwise the unnormalised value is needed elsewhere).
"""
from __future__ import annotations

import math
import operator

import torch
from torch import fx

aten = torch.ops.aten
_BN = aten._native_batch_norm_legit_no_training.default
_FOLDABLE = {aten.conv2d.default: 1, aten.linear.default: 1}


def get_attr_value(gm: fx.GraphModule, node) -> torch.Tensor | None:
    """The tensor behind a get_attr node (None for None)."""
    if node is None:
        return None
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        raise TypeError(f"expected a parameter (get_attr node), got {node}")
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def register_constant(gm: fx.GraphModule, base: str, value: torch.Tensor) -> str:
    """Register `value` as a new parameter of gm under a free name derived from `base`."""
    name = base.replace(".", "_")
    i = 0
    while hasattr(gm, f"{name}_{i}"):
        i += 1
    gm.register_parameter(f"{name}_{i}", torch.nn.Parameter(value, requires_grad=False))
    return f"{name}_{i}"


def _scaled_rows(w: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """w [N, ...] times factor [N] (float64) per row, computed in float64 (the promoted type) and
    rounded once to float32 as stored, in blocks of rows of about 128K values (3x one product over
    a 512 x 4608 weight)."""
    out = torch.empty(w.shape, dtype=torch.float32)
    rows = max(1, (1 << 17) // max(1, math.prod(w.shape[1:])))
    f = factor.view(-1, *([1] * (w.dim() - 1)))
    for r in range(0, w.shape[0], rows):
        torch.mul(w[r:r + rows], f[r:r + rows], out=out[r:r + rows])
    return out


def fold_batchnorm(gm: fx.GraphModule) -> int:
    """Fold every foldable conv/linear -> batch_norm pair; returns how many were folded."""
    folded = 0
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not _BN:
            continue
        producer = bn.args[0]
        if (not isinstance(producer, fx.Node) or producer.target not in _FOLDABLE or len(producer.users) != 1):
            continue
        val = producer.meta.get("val")
        if producer.target is aten.linear.default and (val is None or val.dim() != 2):
            continue  # batch norm over dim 1 of a 3-D linear output is not per output feature
        outs = list(bn.users)
        if not all(u.target is operator.getitem and u.args[1] == 0 for u in outs):
            continue  # the batch statistics outputs are used: leave it alone
        try:
            w = get_attr_value(gm, producer.args[1])
            b = get_attr_value(gm, producer.args[2] if len(producer.args) > 2 else None)
            gamma, beta, mean, var = (get_attr_value(gm, a) for a in bn.args[1:5])
        except TypeError:
            continue  # weights computed in the graph: not a foldable constant
        eps = float(bn.args[6])
        n = w.shape[0]
        if mean is None or var is None or mean.numel() != n:
            continue
        inv = torch.rsqrt(var.detach().double() + eps)
        g = gamma.detach().double() if gamma is not None else torch.ones(n, dtype=torch.float64)
        factor = g * inv
        new_w = _scaled_rows(w.detach(), factor)
        b0 = b.detach().double() if b is not None else torch.zeros(n, dtype=torch.float64)
        new_b = ((b0 - mean.detach().double()) * factor + (beta.detach().double() if beta is not None else 0.0)).float()
        base = producer.args[1].target.rsplit(".", 1)[0] if producer.args[1].op == "get_attr" else "folded"
        with gm.graph.inserting_before(producer):
            w_node = gm.graph.get_attr(register_constant(gm, base + ".folded_weight", new_w))
            b_node = gm.graph.get_attr(register_constant(gm, base + ".folded_bias", new_b))
        args = list(producer.args)
        while len(args) < 3:
            args.append(None)
        args[1], args[2] = w_node, b_node
        producer.args = tuple(args)
        for u in outs:
            u.replace_all_uses_with(producer)
            gm.graph.erase_node(u)
        gm.graph.erase_node(bn)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return folded
