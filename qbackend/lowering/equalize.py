"""Cross-layer equalization (Nagel et al., "Data-Free Quantization Through Weight Equalization and
Bias Correction", ICCV 2019, section 4.1), a prepare pass on the BatchNorm-folded graph.

For a conv / linear W1 (bias b1) whose output goes only through a ReLU (or nothing) into the
inputs of groups-1 convs / linears W2, relu(x / s) = relu(x) / s for s > 0, so dividing output
channel i of W1 and b1 by s_i and multiplying input channel i of every W2 by s_i leaves the FP32
function unchanged. With s_i = sqrt(r1_i / r2_i), r1_i the largest |W1| of output channel i and
r2_i the largest |W2| over input channel i, both become sqrt(r1_i r2_i): the channels' weight
ranges even out, and so do the ranges of the activation channels between the two layers, which
share one per-tensor int8 scale. The pairs are equalized in graph order, over the whole network,
`ITERATIONS` times (a layer in two pairs, as W2 of one and W1 of the next, moves with both).

ReLU6 (clamp at 6, MobileNetV2) and other non-homogeneous activations break the identity, so
those pairs are left alone, as is a value read by anything but the pair's layers (a residual add,
a concat). The scaled weights are new constants of the graph (lowering/fold.register_constant);
the model's own parameters are never modified. QuantConfig.equalization turns it on.
"""
from __future__ import annotations

import torch
from torch import fx

from .fold import get_attr_value, register_constant

aten = torch.ops.aten
_LAYERS = (aten.conv2d.default, aten.linear.default)
ITERATIONS = 4
_S_RANGE = (1e-4, 1e4)


def _groups(node: fx.Node) -> int:
    if node.target is aten.linear.default:
        return 1
    return int(node.args[6]) if len(node.args) > 6 else int(node.kwargs.get("groups", 1))


def _constant(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "get_attr"


def _pairs(gm: fx.GraphModule) -> list[tuple[fx.Node, list[fx.Node]]]:
    """(W1's node, the W2 nodes reading its output through at most a ReLU), in graph order."""
    pairs = []
    for first in gm.graph.nodes:
        if first.op != "call_function" or first.target not in _LAYERS or not _constant(first.args[1]):
            continue
        if len(first.args) > 2 and first.args[2] is not None and not _constant(first.args[2]):
            continue
        value = first
        if len(first.users) == 1:
            (user,) = first.users
            if user.op == "call_function" and user.target in (aten.relu.default, aten.relu_.default):
                value = user
        readers = list(value.users)
        if not readers or any(r.op != "call_function" or r.target not in _LAYERS or r.args[0] is not value
                              or value in r.args[1:] or _groups(r) != 1 or not _constant(r.args[1])
                              for r in readers):
            continue
        if value is first and len(first.users) != len(readers):
            continue
        out_channels = get_attr_value(gm, first.args[1]).shape[0]
        if any(get_attr_value(gm, r.args[1]).shape[1] != out_channels for r in readers):
            continue  # a flatten or reshape between them would have shown up as a user
        pairs.append((first, readers))
    return pairs


def _set_constant(gm: fx.GraphModule, node: fx.Node, index: int, value: torch.Tensor, base: str) -> None:
    with gm.graph.inserting_before(node):
        attr = gm.graph.get_attr(register_constant(gm, base, value))
    args = list(node.args)
    while len(args) <= index:
        args.append(None)
    args[index] = attr
    node.args = tuple(args)


def equalize(gm: fx.GraphModule) -> int:
    """Equalize every pair (the module docstring); returns how many pairs were found."""
    pairs = _pairs(gm)
    if not pairs:
        return 0
    weights = {}  # node -> its weight (fp64), updated in place across iterations
    biases = {}
    for first, readers in pairs:
        for node in (first, *readers):
            if node not in weights:
                weights[node] = get_attr_value(gm, node.args[1]).detach().double().clone()
                b = node.args[2] if len(node.args) > 2 else None
                biases[node] = None if b is None else get_attr_value(gm, b).detach().double().clone()
    for _ in range(ITERATIONS):
        for first, readers in pairs:
            w1 = weights[first]
            r1 = w1.reshape(w1.shape[0], -1).abs().amax(1)
            r2 = torch.stack([weights[r].transpose(0, 1).reshape(w1.shape[0], -1).abs().amax(1)
                              for r in readers]).amax(0)
            s = torch.where((r1 > 0) & (r2 > 0), torch.sqrt(r1 / r2.clamp_min(1e-300)), torch.ones_like(r1))
            s = s.clamp(*_S_RANGE)
            weights[first] = w1 / s.view(-1, *([1] * (w1.dim() - 1)))
            if biases[first] is not None:
                biases[first] = biases[first] / s
            for r in readers:
                w2 = weights[r]
                weights[r] = w2 * s.view(1, -1, *([1] * (w2.dim() - 2)))
    for node, w in weights.items():
        base = node.args[1].target.rsplit(".", 1)[0]
        _set_constant(gm, node, 1, w.float(), base + ".equalized_weight")
        if biases[node] is not None:
            _set_constant(gm, node, 2, biases[node].float(), base + ".equalized_bias")
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return len(pairs)
