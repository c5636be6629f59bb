"""Flattens of channels-last int8 activations read as NHWC, with the Linear weights permuted to match.

qbackend's convs (and its int8 max pooling) write channels-last: flattening their [N, C, H, W]
output to [N, C*H*W] in NCHW order has to reorder the data (a copy per call). Where such a flatten
is read only by static quantized Linears (as their input x), the flatten reads the NHWC memory as
it lies instead (permute(0, 2, 3, 1), then the same reshape: a view) and each Linear's int8 weight
has its input columns permuted to match: column c*H*W + s (s = h*W + w) of the FP32 layer moves
to s*C + c. Each output is the same sum of the same integer products, so the outputs are
bit-identical. Columns are permuted after the weight is rounded (GPTQ rounds in the FP32 order)
and before it is packed; the model file holds the permuted weight and the graph with the permute.

The permutation depends only on C and H*W, and the flatten is taken where export's symbolic
shapes prove it flattens dims 1..3 for every input (a symbolic batch or spatial size included).
Not applied where H*W == 1 (a flatten after global pooling is a view already).
"""
from __future__ import annotations

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .graph_utils import example_shape, node_value

aten = torch.ops.aten

# Off: flattens keep the NCHW order (the reference the tests compare the rewrite against).
_ENABLED = True

_FLATTENS = frozenset({aten.reshape.default, aten.view.default, aten._unsafe_view.default, aten.flatten.using_ints})
# The int8 forms of these keep a channels-last layout (qbackend.max_pool2d writes channels-last).
_KEEP_LAYOUT = frozenset({aten.max_pool2d.default})


def column_order(channels: int, spatial: int) -> torch.Tensor:
    """perm with perm[s*C + c] = c*HW + s: w[:, perm] is a weight over NCHW-flattened inputs
    re-indexed for NHWC-flattened ones."""
    return torch.arange(channels * spatial).reshape(channels, spatial).t().reshape(-1)


def nhwc_features(x: torch.Tensor, channels: int, spatial: int) -> torch.Tensor:
    """x's last dim (features flattened in NCHW order) re-ordered as the NHWC flatten."""
    return x[..., column_order(channels, spatial)]


def _known_equal(a, b) -> bool:
    """a == b for every input the export admits (ints or export's symbolic sizes)."""
    return bool(statically_known_true(a == b))


def _is_flatten_1_to_3(node: fx.Node) -> bool:
    """node flattens a 4-D float value's dims 1..3 into one, for every input the export admits."""
    if node.op != "call_function" or node.target not in _FLATTENS or not isinstance(node.args[0], fx.Node) \
            or node.kwargs:
        return False
    if node.target is aten.flatten.using_ints and tuple(node.args[1:]) not in ((1, 3), (1, -1), (1,)):
        return False
    src, out = node_value(node.args[0]), node_value(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if src.dim() != 4 or out.dim() != 2 or not src.is_floating_point():
        return False
    n, c, h, w = src.shape
    return _known_equal(out.shape[0], n) and _known_equal(out.shape[1], c * h * w)


def _channels_last_int8(node: fx.Node, conv_outputs: set, qparams: dict) -> bool:
    """node's int8 form is written channels-last: a static conv's int8 output, or int8 max pooling
    of one (re-run on int8, not quantized afresh)."""
    while node not in conv_outputs:
        if node in qparams or node.op != "call_function" or node.target not in _KEEP_LAYOUT:
            return False
        node = node.args[0]
    return True


def plan(ops, qparams: dict, int8_outputs: set, recorders) -> dict[fx.Node, tuple[int, int]]:
    """{float flatten node: (C, H*W) of the value it flattens} for each flatten to read as NHWC (see the
    module docstring). ops: the matched ops (on the graph being rewritten); recorders(node): whether
    a node is an observer / statistics call (dropped later, so not a reader)."""
    if not _ENABLED:
        return {}
    conv_outputs = {op.output for op in ops if op.kind == "conv2d" and op.config.mode == "static"
                    and op.output in int8_outputs}
    readers: dict[fx.Node, list] = {}
    for op in ops:
        if op.kind == "linear" and op.config.mode == "static":
            readers.setdefault(op.x, []).append(op.anchor)
    chosen = {}
    for flat, anchors in readers.items():
        if flat in qparams or not _is_flatten_1_to_3(flat):
            continue  # quantized afresh (its own observer) or not a flatten of a 4-D value
        users = [u for u in flat.users if not recorders(u)]
        if any(u not in anchors or u.args[0] is not flat or flat in u.args[1:] for u in users):
            continue  # some other reader needs the NCHW order
        src = flat.args[0]
        _, c, h, w = example_shape(src)
        if h * w == 1 or not _channels_last_int8(src, conv_outputs, qparams):
            continue
        chosen[flat] = (c, h * w)
    return chosen


def read_as_nhwc(graph: fx.Graph, flat8: fx.Node) -> None:
    """Make the int8 flatten `flat8` (of a channels-last [N, C, H, W] value) read it as [N, H, W, C]."""
    if flat8.op != "call_function" or flat8.target not in _FLATTENS:
        raise RuntimeError(f"qbackend internal error: {flat8.name} is not the int8 flatten planned")
    with graph.inserting_before(flat8):
        nhwc = graph.call_function(aten.permute.default, (flat8.args[0], [0, 2, 3, 1]))
    nhwc.meta = {k: v for k, v in flat8.meta.items() if k in ("nn_module_stack", "stack_trace")}
    flat8.args = (nhwc, *flat8.args[1:])
