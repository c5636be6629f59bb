"""The SmoothQuant pass of the lowering (the search itself: qbackend.algorithms.smoothquant):

* which values (`find_groups`, at prepare): every float value quantized at a border (not produced
  in int8 by another op, not an int8 cat) whose int8 readers are all Linears reading it directly
  (no view in between), so that channel c of the value is column c of every weight; with
  QuantConfig.smoothquant="auto" (the default) only LayerNorm outputs (transformer blocks);
* folding, at no run-time cost: where the value is the output of a LayerNorm that only those
  Linears read (pre-LN blocks), 1/s goes into the LayerNorm's weight and bias and the value is
  quantized per tensor; elsewhere (post-LN blocks such as BERT's, where the LayerNorm output is
  also the residual, so the float value itself must not change) the value's quantize op divides
  channel c by s_c: quantize_per_channel with scales scale * s, as fast as per tensor.
  `fold_fp32` applies either fold to the float graph alone (the exactness check).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from ..algorithms.smoothquant import smoothed_weight
from .fold import get_attr_value, register_constant
from .graph_utils import is_float_tensor
from .plan import Plan, static_readers

aten = torch.ops.aten
STATS_PREFIX = "qbackend_channel_stats_"


@dataclass
class SmoothGroup:
    """A value to smooth and the Linears that read it (in the prepared graph)."""

    value: fx.Node
    ops: list            # the QuantizableOps (linear, static) reading it
    stats: str           # the ChannelStats submodule's name
    fold: str            # "layer_norm" | "quantize"


def is_layer_norm(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.layer_norm.default


def _layer_norm_parts(node: fx.Node):
    """(weight node, bias node) of an aten.layer_norm whose affine parameters are graph
    attributes, else None."""
    if not is_layer_norm(node) or len(node.args) < 4:
        return None
    w, b = node.args[2], node.args[3]
    if isinstance(w, fx.Node) and w.op == "get_attr" and isinstance(b, fx.Node) and b.op == "get_attr":
        return w, b
    return None


def find_groups(plan: Plan, ops: list, layer_norm_only: bool = False) -> dict[fx.Node, list]:
    """value -> the static Linears reading it, for every value that can be smoothed (module
    docstring; layer_norm_only: LayerNorm outputs only, QuantConfig.smoothquant="auto"). Observer
    nodes must not have been added yet (the LayerNorm fold looks at users)."""
    groups = {}
    for r, lst in static_readers(plan, ops).items():
        if r in plan.int8_outputs or r in plan.int8_cats or not is_float_tensor(r):
            continue
        if layer_norm_only and not is_layer_norm(r):
            continue
        if all(op.kind == "linear" and what == "input" and value is r for op, what, value in lst):
            groups[r] = [op for op, _, _ in lst]
    return groups


def fold_kind(value: fx.Node, ops: list) -> str:
    anchors = {op.anchor for op in ops}
    if _layer_norm_parts(value) is not None and set(value.users) <= anchors:
        return "layer_norm"
    return "quantize"


def _replace_attr(gm: fx.GraphModule, user: fx.Node, index: int, value: torch.Tensor) -> None:
    """Make argument `index` of `user` (a get_attr) read `value`, registered as a new attribute."""
    old = user.args[index]
    name = register_constant(gm, f"{old.target}_smoothed", value)
    with gm.graph.inserting_before(user):
        attr = gm.graph.get_attr(name)
    args = list(user.args)
    args[index] = attr
    user.args = tuple(args)


def fold_layer_norm(gm: fx.GraphModule, value: fx.Node, s: torch.Tensor) -> None:
    """Divide the LayerNorm's weight and bias by s (new attributes; the originals, shared with the
    user's model, are not touched)."""
    for i, node in zip((2, 3), _layer_norm_parts(value)):
        t = get_attr_value(gm, node)
        _replace_attr(gm, value, i, (t.detach().float() / s).to(t.dtype))


def fold_fp32(gm: fx.GraphModule, value: fx.Node, linears: list[fx.Node], s: torch.Tensor,
              fold: str) -> None:
    """Apply a smoothing to a float graph, in place: the value's Linears get weights W s, and the
    value is divided by s (in the LayerNorm, or by a mul before those Linears). The result computes
    the same function up to float rounding; tests check it does."""
    if fold == "layer_norm":
        fold_layer_norm(gm, value, s)
        divided = value
    else:
        name = register_constant(gm, "qbackend_smooth_inverse", (1.0 / s).contiguous())
        with gm.graph.inserting_after(value):
            inv = gm.graph.get_attr(name)
        with gm.graph.inserting_after(inv):
            divided = gm.graph.call_function(aten.mul.Tensor, (value, inv))
    for anchor in linears:
        _replace_attr(gm, anchor, 1, smoothed_weight(get_attr_value(gm, anchor.args[1]), s))
        anchor.args = (divided, *anchor.args[1:])
    gm.graph.lint()
    gm.recompile()
