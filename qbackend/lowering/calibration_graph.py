"""The graph calibration batches run through: the prepared graph with its image inputs made
channels-last, so torch's FP32 convolutions take oneDNN's NHWC kernels (a batch of 8 at 224x224
on Zen 5: ResNet-50 312 -> 248 ms, ResNet-18 99 -> 76, MobileNetV2 76 -> 55) and the layout
carries through the elementwise ops, pools and observers behind them.

It is a second GraphModule over the same submodules and parameters (the observers and statistics
recorders it calls are the prepared graph's own, so what it records is what convert reads); the
prepared graph itself, which convert copies and rewrites, is left as it was. The layout changes
no value, only which FP32 kernel computes it (a convolution may round differently in its last
bits, as between any two kernels). What a layout change could break is handled here:

* views (`aten.view`, `aten._unsafe_view`) become reshapes, which copy where the layout needs it;
* tensor outputs are made contiguous, so callers see the layout the model gives.

An activation (relu, hardtanh) whose input is a fresh value (a conv's, linear's, add's or mul's
output) that nothing else reads runs in place: the same values without a second activation-sized
buffer (ResNet-18, 4 batches of 8 on the AMX Xeon: clamp_min 37 -> 10 ms, the new buffers' page faults).

Graphs without a 4-D convolution or a 4-D floating input, or with an op outside `_LAYOUT_FREE` (ops
known to compute the same values in either layout), run as prepared (None).
"""
from __future__ import annotations

import operator

import torch
from torch import fx
from torch.utils._pytree import tree_map

from .functionalize import FUNCTIONAL

aten = torch.ops.aten

_CONVS = {aten.conv2d.default, aten.convolution.default, aten._convolution.default}
_VIEWS = {aten.view.default, aten._unsafe_view.default}
_LAYOUT_FREE = FUNCTIONAL | _CONVS | _VIEWS | {
    aten.reshape.default, aten.flatten.using_ints, aten.sym_size.int, aten.clone.default, aten.relu6.default,
    aten._native_batch_norm_legit_no_training.default, operator.getitem, operator.mul,
}


# activation -> its in-place form, where its input is made by one of _FRESH and read by it alone
_IN_PLACE = {aten.relu.default: aten.relu_.default, aten.hardtanh.default: aten.hardtanh_.default}
_FRESH = _CONVS | {aten.add.Tensor, aten.linear.default, aten.mul.Tensor}


def _in_place(node: fx.Node) -> bool:
    """Whether `node` (of the prepared graph) may run as its activation's in-place form."""
    if node.op != "call_function" or node.target not in _IN_PLACE or not node.args:
        return False
    x = node.args[0]
    return isinstance(x, fx.Node) and x.op == "call_function" and x.target in _FRESH and len(x.users) == 1


def _image_input(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return node.op == "placeholder" and isinstance(val, torch.Tensor) and val.is_floating_point() and val.dim() == 4


def calibration_graph(gm: fx.GraphModule) -> fx.GraphModule | None:
    """The channels-last calibration graph of a prepared graph (see the module docstring), or None."""
    nodes = list(gm.graph.nodes)
    if not any(n.op == "call_function" and n.target in _CONVS for n in nodes) \
            or not any(_image_input(n) for n in nodes):
        return None
    if any(n.op == "call_method" or (n.op == "call_function" and n.target not in _LAYOUT_FREE) for n in nodes):
        return None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            def contiguous(a):
                if not isinstance(a, fx.Node):
                    return a
                val = a.meta.get("val")
                if isinstance(val, torch.Tensor) and val.dim() >= 4:
                    return graph.call_method("contiguous", (a,))
                return a

            graph.output(tree_map(contiguous, fx.map_arg(node.args[0], lambda n: env[n])))
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if node.op == "call_function" and node.target in _VIEWS:
            new.target = aten.reshape.default
        elif _in_place(node):
            new.target = _IN_PLACE[node.target]
        env[node] = new
        if _image_input(node):
            env[node] = graph.call_method("contiguous", (new,), {"memory_format": torch.channels_last})
            env[node].meta = dict(node.meta)
    graph._codegen = gm.graph._codegen
    return fx.GraphModule(gm, graph, class_name="CalibrationGraph")
