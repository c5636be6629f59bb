"""Prepare: capture the model, fold BatchNorm, match the quantizable ops, make the plan, and put
an observer on every value the plan observes. The result (`PreparedGraph`) runs the model in
FP32 and records activation ranges as calibration batches go through it."""
from __future__ import annotations

import warnings

import torch
from torch import fx, nn

from ..config import QuantConfig
from ..observers import Observer
from .capture import capture
from .embeddings import EmbeddingOp, match_embeddings
from .graph_utils import record_example_shapes
from .fold import fold_batchnorm, get_attr_value
from .patterns import QuantizableOp, match
from .plan import Plan, make_plan
from ..algorithms.gptq import MAX_FEATURES, HessianStats
from ..algorithms.smoothquant import ChannelStats, resolve
from .smoothquant import STATS_PREFIX, SmoothGroup, find_groups, fold_kind

OBSERVER_PREFIX = "qbackend_observer_"
HESSIAN_PREFIX = "qbackend_hessian_"


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

    def __init__(self, gm: fx.GraphModule, ops: list[QuantizableOp], plan: Plan, skipped: list, folded: int,
                 embeddings: list[EmbeddingOp] | None = None, smooth_groups: list[SmoothGroup] | None = None,
                 config: QuantConfig | None = None, hessians: dict[str, str] | None = None):
        self.gm, self.ops, self.plan, self.skipped, self.folded = gm, ops, plan, skipped, folded
        self.hessians = dict(hessians or {})  # layer name -> its input's HessianStats submodule (GPTQ)
        self.embeddings = list(embeddings or [])  # weight-only tables, rewritten at convert
        self.smooth_groups = list(smooth_groups or [])  # SmoothQuant candidates, searched at convert
        self.config = config

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


def _batchable(example_inputs: tuple, example_kwargs: dict | None) -> tuple[tuple, dict, bool]:
    """Export specialises a size-1 dimension to 1; a batch of one (every tensor input, positional
    or keyword, has a leading 1) is repeated to two for the capture so the graph takes any batch
    size (the values do not matter, only the shapes). Returns (args, kwargs, repeated)."""
    kwargs = dict(example_kwargs or {})
    tensors = [x for x in (*example_inputs, *kwargs.values()) if isinstance(x, torch.Tensor)]
    if not (tensors and all(t.dim() > 0 and t.shape[0] == 1 for t in tensors)):
        return tuple(example_inputs), kwargs, False

    def two(x):
        return x.repeat(2, *([1] * (x.dim() - 1))) if isinstance(x, torch.Tensor) else x

    return tuple(two(x) for x in example_inputs), {k: two(v) for k, v in kwargs.items()}, True


def _record_after(gm: fx.GraphModule, node: fx.Node, name: str, recorder: nn.Module) -> None:
    """Add `recorder` as submodule `name` and call it on node's value right after node (after the
    last placeholder for an input: the placeholders stay first)."""
    gm.add_submodule(name, recorder)
    anchor = node
    if node.op == "placeholder":
        anchor = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    with gm.graph.inserting_after(anchor):
        gm.graph.call_module(name, (node,))


def prepare_graph(model: nn.Module, example_inputs: tuple, config: QuantConfig,
                  example_kwargs: dict | None = None) -> PreparedGraph:
    """Raises lowering.capture.CaptureError if the model cannot be captured."""
    args, kwargs, repeated = _batchable(tuple(example_inputs), example_kwargs)
    gm = capture(model, args, kwargs)
    if repeated:  # route, prepack and tune for the batch the user gave, not the capture's
        try:
            record_example_shapes(gm, tuple(example_inputs), example_kwargs)
        except Exception as exc:  # noqa: BLE001  (the hints still give a valid, if less tuned, route)
            warnings.warn(f"the captured graph did not run on the batch-1 example ({type(exc).__name__}: {exc}); "
                          "layers are routed for a batch of 2", RuntimeWarning, stacklevel=3)
    folded = fold_batchnorm(gm)
    ops, skipped = match(gm, model, config)
    embeddings, skipped_tables = match_embeddings(gm, model, config)
    plan = make_plan(ops)
    smooth_groups = []
    sq = resolve(config.smoothquant)
    if sq is not None:  # before the observers: the LayerNorm fold looks at users
        groups = find_groups(plan, ops, layer_norm_only=config.smoothquant == "auto")
        for i, (value, readers) in enumerate(groups.items()):
            smooth_groups.append(SmoothGroup(value, readers, f"{STATS_PREFIX}{i}", fold_kind(value, readers)))
    for i, (node, name) in enumerate(plan.observed.items()):
        spec = _observer_spec_for(plan, node)
        _record_after(gm, node, f"{OBSERVER_PREFIX}{i}", ActivationObserver(spec.create(name)))
    for group in smooth_groups:
        _record_after(gm, group.value, group.stats, ChannelStats(plan.observed[group.value], sq.sample_rows))
    hessians, by_value = {}, {}
    for op in ops:
        if op.kind != "linear" or op.config.mode != "static" or op.config.weight_rounding != "gptq" \
                or get_attr_value(gm, op.weight).shape[1] > MAX_FEATURES:
            continue
        if op.x not in by_value:
            by_value[op.x] = f"{HESSIAN_PREFIX}{len(by_value)}"
            _record_after(gm, op.x, by_value[op.x], HessianStats(f"{op.name}.input"))
        hessians[op.name] = by_value[op.x]
    gm.recompile()
    return PreparedGraph(gm, ops, plan, skipped + skipped_tables, folded, embeddings, smooth_groups, config,
                         hessians)
