"""The quantization plan: which values are observed during calibration and which flow in int8.

Given the matched ops (patterns.match), for every static op:

* its input x, and its residual input, are quantized at their *root*: the value reached by
  walking back through transparent ops (max pooling, views, flatten). The root is observed, and
  the transparent chain then runs on int8 data (exact, and 4x less memory traffic);
* its output is produced in int8 (requantized in the kernel's epilogue) when some consumer takes
  it in int8: another static op (as x or as residual), or a transparent op whose result is taken
  in int8. Then the output is observed too. Otherwise the kernel writes float32 directly.

A cat read in int8 runs in int8: its output is observed, every input is quantized with the cat's
qparams (so the int8 cat equals quantizing the float cat), and a static op whose output only
feeds that cat writes it in int8 with those qparams directly (`aliases`: no requantize).

A global average pool (adaptive_avg_pool2d to 1 x 1, a CNN's classifier head) whose result is read
in int8 and whose input is a static op's output read by nothing else takes that output in int8
too (observed as the op's output): convert pools the integers and requantizes in one op
(lowering/global_pool.py), so the head stays in int8 from the last conv on.

A static Linear named in `float_inputs` (convert's per-token choice: lowering/per_token.py) reads
its input as float and quantizes it itself, so it is no int8 reader of it.

A value is observed once, however many ops read it (one observer per value, named after the
first layer that needs it: "layer1.0.conv1.input", "layer1.0.conv2.output").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

from .graph_utils import is_float_tensor
from .patterns import TRANSPARENT, QuantizableOp

aten = torch.ops.aten


def is_transparent(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in TRANSPARENT and len(node.args) >= 1
            and isinstance(node.args[0], fx.Node)
            and not any(isinstance(a, fx.Node) for a in list(node.args[1:]) + list(node.kwargs.values())))


def root(node: fx.Node, outputs: set) -> fx.Node:
    """The value a quantized read of `node` starts from (see the module docstring)."""
    while node not in outputs and is_transparent(node):
        node = node.args[0]
    return node


def is_global_avg_pool(node: fx.Node) -> bool:
    """aten.adaptive_avg_pool2d of a value to a 1 x 1 output."""
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and node.target is aten.adaptive_avg_pool2d.default and len(node.args) == 2
            and isinstance(node.args[0], fx.Node) and isinstance(node.args[1], (list, tuple))
            and tuple(node.args[1]) in ((1, 1), (1,)))


def is_int8_cat(node: fx.Node) -> bool:
    """aten.cat of float tensors along a constant dim (the kind the plan runs in int8)."""
    return (node.op == "call_function" and node.target is aten.cat.default and len(node.args) >= 1
            and isinstance(node.args[0], (list, tuple)) and len(node.args[0]) > 0
            and all(is_float_tensor(a) for a in node.args[0])
            and not any(isinstance(a, fx.Node) for a in node.args[1:]))


@dataclass
class Plan:
    """Which values are observed and which flow in int8 (see the module docstring)."""

    ops: list[QuantizableOp]
    observed: dict = field(default_factory=dict)        # node -> observer name
    int8_outputs: set = field(default_factory=set)      # output nodes of static ops produced in int8
    static_outputs: set = field(default_factory=set)    # output nodes of all static ops
    aliases: dict = field(default_factory=dict)         # static op output -> the int8 cat it alone feeds
    int8_cats: set = field(default_factory=set)         # cats that run in int8

    def observer_of(self, node: fx.Node) -> str:
        return self.observed[node]


def static_readers(plan: Plan, ops: list[QuantizableOp]) -> dict[fx.Node, list[tuple]]:
    """root value -> (op, "input" | "residual", the node the op reads) for every static op reading
    it as its input or its residual, in the ops' order."""
    readers: dict[fx.Node, list[tuple]] = {}
    for op in ops:
        if op.config.mode != "static":
            continue
        for value, what in ((op.x, "input"), (op.accum, "residual")):
            if value is not None:
                readers.setdefault(root(value, plan.static_outputs), []).append((op, what, value))
    return readers


def make_plan(ops: list[QuantizableOp], float_inputs: frozenset = frozenset()) -> Plan:
    """The plan of the module docstring; float_inputs: names of static Linears that read their
    input (x) as float."""
    static = [op for op in ops if op.config.mode == "static"]
    plan = Plan(ops=ops, static_outputs={op.output for op in static})
    int8_readers: dict[fx.Node, list[str]] = {}  # root value -> names of ops reading it in int8
    for op in static:
        for value, what in ((op.x, "input"), (op.accum, "residual")):
            if value is None or (what == "input" and op.name in float_inputs):
                continue
            r = root(value, plan.static_outputs)
            int8_readers.setdefault(r, []).append(f"{op.name}.{what}")
    by_output = {op.output: op for op in static}
    for r in list(int8_readers):
        src = r.args[0] if is_global_avg_pool(r) and is_float_tensor(r.args[0]) else None
        if src in by_output and len(src.users) == 1:
            int8_readers.setdefault(src, []).append(f"{by_output[src].name}.output")
    for r, readers in int8_readers.items():
        if r in by_output:
            plan.int8_outputs.add(r)
            plan.observed[r] = f"{by_output[r].name}.output"
        else:
            plan.observed[r] = readers[0]
        if is_int8_cat(r):
            plan.int8_cats.add(r)
            for part in r.args[0]:
                if part in by_output and len(part.users) == 1 and part not in int8_readers:
                    plan.aliases[part] = r
                    plan.int8_outputs.add(part)
    return plan
