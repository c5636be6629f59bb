"""Pattern matching on the captured ATen graph: which conv2d/linear calls become int8 ops, with
what they absorb, and which ops can carry int8 values unchanged.

A quantizable op is an aten.conv2d / aten.linear whose weight is a parameter (after BatchNorm
folding) and whose input is a float32 tensor, optionally followed by (each the single user of
the previous node):

    conv2d -> add(other)            the residual add, fused as the conv's sum post-op
           -> relu | relu6 | hardtanh(0, 6) | gelu (exact)   the activation, fused as the post-op
    linear -> relu | relu6 | hardtanh(0, 6) | gelu

Anything else after it (silu, hardswish, a linear's residual add, ...) runs as a separate op.
When two convs feed one add, the first in graph order absorbs it (the other one's int8 output is
its residual). Modules called at several places are matched per call (the graph has one node per call), so a
torchvision block that reuses one nn.ReLU is no different from one with three.

Transparent ops move values without changing them (max pooling, views, reshapes, flatten,
permutes): on a quantized tensor they give the same quantized tensor as quantizing their float
result, so they run in int8 with their input's qparams.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

from ..config import QuantConfig
from ..dispatch.routing import exact_route_exists, seven_bit_speedup
from .fold import get_attr_value
from .graph_utils import example_shape, is_float_tensor, module_path
from .layer_spec import LayerSpec

aten = torch.ops.aten

ANCHORS = {aten.conv2d.default: "conv2d", aten.linear.default: "linear"}

# Ops with a float32 value as args[0] and no other tensor argument whose result on int8 data is
# exact (the same integers as quantizing the float result with the input's qparams).
TRANSPARENT = frozenset({
    aten.max_pool2d.default, aten.flatten.using_ints, aten.view.default, aten.reshape.default,
    aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.unsqueeze.default, aten.permute.default, aten.transpose.int, aten.t.default, aten.expand.default,
    aten.select.int, aten.slice.Tensor, aten.clone.default,
})

# Ops that do the work a quantized kernel would, left in FP32 because no pattern here covers them
# (reported by name so users know what stays FP32).
MATMUL_LIKE = frozenset({
    aten.conv1d.default, aten.conv3d.default, aten.conv2d.padding, aten.conv_transpose1d.default,
    aten.conv_transpose2d.input, aten.conv_transpose3d.input, aten.matmul.default, aten.bmm.default,
    aten.mm.default, aten.addmm.default, aten.linear.default, aten.conv2d.default,
})


@dataclass
class QuantizableOp:
    """One conv2d / linear of the captured graph that becomes an int8 op, with the add and activation it absorbs."""

    kind: str                    # "conv2d" | "linear"
    name: str                    # the layer's name (module path, "@k" for its k-th extra call)
    module_type: type | None     # the nn.Module class it came from (None if not known)
    anchor: fx.Node              # the aten.conv2d / aten.linear node
    x: fx.Node                   # its activation input
    weight: fx.Node              # get_attr of the (folded) weight
    bias: fx.Node | None
    geometry: dict = field(default_factory=dict)   # conv2d: stride, padding, dilation, groups
    accum: fx.Node | None = None                  # the residual added before the activation
    post_op: str = "none"                         # none | relu | relu6 | gelu
    output: fx.Node | None = None                 # the last node of the fused chain
    config: QuantConfig | None = None

    @property
    def fused(self) -> list[fx.Node]:
        """The nodes after the anchor that this op absorbs, in order, ending with `output`."""
        nodes, cur = [], self.anchor
        while cur is not self.output:
            cur = next(iter(cur.users))
            nodes.append(cur)
        return nodes

    def exact_8bit_route(self, gm: fx.GraphModule) -> bool:
        """Whether a routed provider (the config's forced one, if any) runs this op on full-range
        8-bit activations exactly on this CPU (else its input needs 7 bits)."""
        return exact_route_exists(self.kind, self.layer_spec(gm).shape_key(), self.config.provider)

    def seven_bit_input(self, gm: fx.GraphModule) -> bool:
        """Whether this static op's input gets 7 bits here: no routed provider (the config's forced
        one, if any) runs it exactly on 8-bit activations, or 7 bits buy speed
        (QuantConfig.seven_bit_for_speed and the 7-bit table's row for it on this CPU's class)."""
        shape, forced = self.layer_spec(gm).shape_key(), self.config.provider
        return not exact_route_exists(self.kind, shape, forced) or (
            self.config.seven_bit_for_speed and seven_bit_speedup(self.kind, shape, forced) is not None)

    def layer_spec(self, gm: fx.GraphModule) -> LayerSpec:
        return LayerSpec(kind=self.kind, name=self.name, weight=get_attr_value(gm, self.weight),
                         bias=get_attr_value(gm, self.bias), x_shape=example_shape(self.x), config=self.config,
                         geometry=dict(self.geometry), post_op=self.post_op)


def _arg(node: fx.Node, i: int, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(
        ("input", "weight", "bias", "stride", "padding", "dilation", "groups")[i], default)


def _pair(v) -> list[int]:
    v = [int(e) for e in (v if isinstance(v, (list, tuple)) else [v])]
    return v * 2 if len(v) == 1 else v


def _activation(node: fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    if node.target is aten.relu.default:
        return "relu"
    if node.target is aten.relu6.default:  # F.relu6 (nn.ReLU6 exports as hardtanh)
        return "relu6"
    if node.target is aten.hardtanh.default:
        lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
        hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
        return "relu6" if (float(lo), float(hi)) == (0.0, 6.0) else None
    if node.target is aten.gelu.default:
        approx = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate", "none")
        return "gelu" if approx == "none" else None
    return None


def _single_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _residual_other(add: fx.Node, cur: fx.Node) -> fx.Node | None:
    """The other operand of add(cur, other) / add(other, cur), when it is a same-shaped float tensor."""
    if add.op != "call_function" or add.target is not aten.add.Tensor or add.kwargs.get("alpha", 1) != 1:
        return None
    if len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is cur else a if b is cur else None
    if not isinstance(other, fx.Node) or other is cur or not is_float_tensor(other):
        return None
    if example_shape(other) != example_shape(cur):
        return None
    return other


def _is_param(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "get_attr"


def match(gm: fx.GraphModule, model: torch.nn.Module, config: QuantConfig):
    """(quantizable ops in graph order, [(layer name, reason) of conv/linear calls left in FP32 that
    the config did not ask for])."""
    ops, skipped, calls = [], [], {}
    claimed: set[fx.Node] = set()  # adds / activations already absorbed (two convs may feed one add)
    for node in gm.graph.nodes:
        kind = ANCHORS.get(node.target) if node.op == "call_function" else None
        if kind is None:
            continue
        path = module_path(node)
        k = calls.get(path, 0)
        calls[path] = k + 1
        name = path if k == 0 else f"{path}@{k}"
        name = name or kind
        try:
            module = model.get_submodule(path) if path else model
        except AttributeError:
            module = None
        cfg = config.for_module(name, module if module is not None else torch.nn.Module())
        if cfg is None:
            continue  # the config keeps it in FP32
        x, w = node.args[0], node.args[1]
        b = _arg(node, 2, None)
        why = None
        if not is_float_tensor(x):
            why = "its input is not a float32 tensor"
        elif not _is_param(w) or (b is not None and not _is_param(b)):
            why = "its weight or bias is computed in the graph, not a parameter"
        elif kind == "conv2d" and len(example_shape(x)) != 4:
            why = "unbatched (3-D) conv2d input"
        elif kind == "linear" and len(example_shape(x)) < 2:
            why = "1-D linear input"
        elif kind == "conv2d" and cfg.mode == "dynamic":
            why = "dynamic quantization applies to Linear layers only"
        if why:
            skipped.append((name, why))
            continue
        op = QuantizableOp(kind=kind, name=name, module_type=type(module) if module is not None else None,
                           anchor=node, x=x, weight=w, bias=b, config=cfg)
        if kind == "conv2d":
            op.geometry = {"stride": _pair(_arg(node, 3, 1)), "padding": _pair(_arg(node, 4, 0)),
                           "dilation": _pair(_arg(node, 5, 1)), "groups": int(_arg(node, 6, 1))}
        cur = node
        nxt = _single_user(cur)
        if kind == "conv2d" and cfg.mode == "static" and nxt is not None:
            other = _residual_other(nxt, cur) if nxt not in claimed else None
            if other is not None:
                op.accum, cur = other, nxt
                nxt = _single_user(cur)
        if nxt is not None and cfg.mode != "weight_only":
            act = _activation(nxt)
            if act is not None and not (cfg.mode == "dynamic" and act == "relu6"):
                op.post_op, cur = act, nxt
        op.output = cur
        claimed.update(op.fused)
        ops.append(op)
    return ops, skipped
