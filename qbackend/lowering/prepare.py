"""Prepare: capture the model, fold BatchNorm, match the quantizable ops, make the plan, and put
an observer on every value the plan observes. The result (`PreparedGraph`) runs the model in
FP32 and records activation ranges as calibration batches go through it."""
from __future__ import annotations

import torch
from torch import fx, nn

from ..config import QuantConfig
from ..observers import Observer
from .capture import capture
from .fold import fold_batchnorm
from .patterns import QuantizableOp, match
from .plan import Plan, make_plan

OBSERVER_PREFIX = "qbackend_observer_"


class ActivationObserver(nn.Module):
    """A graph node that feeds a value to an observer and leaves the value alone."""

    def __init__(self, observer: Observer):
        super().__init__()
        self.observer = observer

    def forward(self, x: torch.Tensor) -> None:
        self.observer.update(x.detach())

    def extra_repr(self) -> str:
        return f"{self.observer.name}: {type(self.observer).__name__}, batches seen: {self.observer.count > 0}"


class PreparedGraph:
    """The captured graph with observers, and what convert needs to rewrite it."""

    def __init__(self, gm: fx.GraphModule, ops: list[QuantizableOp], plan: Plan, skipped: list, folded: int):
        self.gm, self.ops, self.plan, self.skipped, self.folded = gm, ops, plan, skipped, folded

    def observers(self) -> dict[str, Observer]:
        """Observer name (layer.input / layer.output) -> observer."""
        return {m.observer.name: m.observer for name, m in self.gm.named_children()
                if isinstance(m, ActivationObserver)}


def _observer_spec_for(plan: Plan, node: fx.Node):
    for op in plan.ops:
        if op.output is node or op.x is node or op.accum is node:
            return op.config.activation
    for op in plan.ops:  # a root reached through transparent ops
        if plan.observed.get(node, "").startswith(op.name + "."):
            return op.config.activation
    raise AssertionError(f"no op observes {node}")


def _batchable(example_inputs: tuple) -> tuple:
    """Export specialises a size-1 dimension to 1; a batch of one is repeated to two for the
    capture so the graph takes any batch size (the values do not matter, only the shapes)."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if tensors and all(t.dim() > 0 and t.shape[0] == 1 for t in tensors):
        return tuple(x.repeat(2, *([1] * (x.dim() - 1))) if isinstance(x, torch.Tensor) else x
                     for x in example_inputs)
    return tuple(example_inputs)


def prepare_graph(model: nn.Module, example_inputs: tuple, config: QuantConfig,
                  example_kwargs: dict | None = None) -> PreparedGraph:
    """Raises lowering.capture.CaptureError if the model cannot be captured."""
    gm = capture(model, _batchable(example_inputs), example_kwargs)
    folded = fold_batchnorm(gm)
    ops, skipped = match(gm, model, config)
    plan = make_plan(ops)
    for i, (node, name) in enumerate(plan.observed.items()):
        spec = _observer_spec_for(plan, node)
        mod_name = f"{OBSERVER_PREFIX}{i}"
        gm.add_submodule(mod_name, ActivationObserver(spec.create(name)))
        anchor = node
        if node.op == "placeholder":  # keep the placeholders first
            anchor = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
        with gm.graph.inserting_after(anchor):
            gm.graph.call_module(mod_name, (node,))
    gm.recompile()
    return PreparedGraph(gm, ops, plan, skipped, folded)
