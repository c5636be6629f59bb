"""The passes of prepare (their order: lowering/pipeline.py PREPARE): capture the model, fold
BatchNorm, match the quantizable ops and tables, make the plan, and put an observer on every value
the plan observes, with SmoothQuant's, GPTQ's and bias correction's statistics and the per-token
candidates' row samples beside them. Each
pass takes the PrepareState and hands it on; the result (`PreparedGraph`) runs the model in FP32
and records activation ranges as calibration batches go through it."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from ..config import QuantConfig
from ..observers import Observer
from ..observers.outliers import TailHistogram, needs_tail_histogram
from .calibration_graph import calibration_graph
from .capture import capture
from .embeddings import EmbeddingOp, match_embeddings
from .graph_utils import example_shape, record_example_shapes
from .equalize import equalize
from .fold import fold_batchnorm, get_attr_value
from .patterns import QuantizableOp, match
from .plan import Plan, make_plan, root
from ..algorithms.gptq import MAX_FEATURES, HessianStats, conv_takes_gptq
from ..algorithms.smoothquant import ChannelStats, resolve
from .smoothquant import STATS_PREFIX, SmoothGroup, find_groups, fold_kind
from . import per_token
from .per_token import TokenGroup

OBSERVER_PREFIX = "qbackend_observer_"
HESSIAN_PREFIX = "qbackend_hessian_"


class ActivationObserver(nn.Module):
    """A graph node that feeds a value to an observer and leaves the value alone. An observer
    without a histogram (the min/max family) gets a TailHistogram beside it (`tails`), from which
    convert tells whether its range is dominated by outliers (observers/outliers.py)."""

    def __init__(self, observer: Observer):
        super().__init__()
        self.observer = observer
        self.tails = TailHistogram(name=observer.name) if needs_tail_histogram(observer) else None

    def forward(self, x: torch.Tensor) -> None:
        x = x.detach()
        self.observer.update(x)
        if self.tails is not None:
            self.tails.update(x)

    def extra_repr(self) -> str:
        return f"{self.observer.name}: {type(self.observer).__name__}, batches seen: {self.observer.count > 0}"


class PreparedGraph:
    """The captured graph with observers, and what convert needs to rewrite it."""

    def __init__(self, gm: fx.GraphModule, ops: list[QuantizableOp], plan: Plan, skipped: list, folded: int,
                 embeddings: list[EmbeddingOp] | None = None, smooth_groups: list[SmoothGroup] | None = None,
                 config: QuantConfig | None = None, hessians: dict[str, str] | None = None,
                 token_groups: list[TokenGroup] | None = None):
        self.gm, self.ops, self.plan, self.skipped, self.folded = gm, ops, plan, skipped, folded
        self.token_groups = list(token_groups or [])  # values their Linears may read per token, chosen at convert
        self.hessians = dict(hessians or {})  # layer name -> its input's HessianStats submodule (GPTQ, bias correction)
        self.embeddings = list(embeddings or [])  # weight-only tables, rewritten at convert
        self.smooth_groups = list(smooth_groups or [])  # SmoothQuant candidates, searched at convert
        self.config = config
        self._calibration_gm: fx.GraphModule | None | bool = False  # built on the first calibration call

    def calibration_module(self) -> fx.GraphModule:
        """The graph calibration batches run through (lowering/calibration_graph.py: channels-last
        images where that is safe, else the prepared graph itself)."""
        if self._calibration_gm is False:
            self._calibration_gm = calibration_graph(self.gm)
        return self._calibration_gm if self._calibration_gm is not None else self.gm

    def observers(self) -> dict[str, Observer]:
        """Observer name (layer.input / layer.output) -> observer."""
        return {m.observer.name: m.observer for name, m in self.gm.named_children()
                if isinstance(m, ActivationObserver)}

    def statistics(self) -> list[tuple[str, object]]:
        """Every calibration statistic convert reads, as (submodule name, recorder) in the graph's
        order: the observers (and the TailHistogram beside a min/max one), SmoothQuant's
        ChannelStats and the HessianStats recorders."""
        out = []
        for name, m in self.gm.named_children():
            if isinstance(m, ActivationObserver):
                out.append((name, m.observer))
                if m.tails is not None:
                    out.append((f"{name}.tails", m.tails))
            elif isinstance(m, (ChannelStats, HessianStats)):
                out.append((name, m))
        return out

    def tail_histograms(self) -> dict[str, TailHistogram]:
        """Observer name -> the TailHistogram beside it, for observers without a histogram."""
        return {m.observer.name: m.tails for name, m in self.gm.named_children()
                if isinstance(m, ActivationObserver) and getattr(m, "tails", None) is not None}


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


@dataclass
class PrepareState:
    """What the prepare passes read and write, in the order they fill it: the model and its
    example inputs and config; the captured graph (`repeated`: a batch of one captured as two);
    the BatchNorms folded; the matched layers and tables and what was skipped, with why; the plan;
    SmoothQuant's candidate groups; the per-token candidates; the input statistics recorder per
    layer (GPTQ, bias correction)."""

    model: nn.Module
    example_args: tuple
    example_kwargs: dict | None
    config: QuantConfig
    gm: fx.GraphModule | None = None
    repeated: bool = False
    folded: int = 0
    ops: list[QuantizableOp] = field(default_factory=list)
    skipped: list = field(default_factory=list)
    embeddings: list[EmbeddingOp] = field(default_factory=list)
    plan: Plan | None = None
    smooth_groups: list[SmoothGroup] = field(default_factory=list)
    token_groups: list[TokenGroup] = field(default_factory=list)
    hessians: dict[str, str] = field(default_factory=dict)


def capture_graph(state: PrepareState) -> PrepareState:
    """torch.export of the model (lowering/capture.py; CaptureError if it fails)."""
    args, kwargs, state.repeated = _batchable(tuple(state.example_args), state.example_kwargs)
    state.gm = capture(state.model, args, kwargs, state.config.dynamic_dims)
    return state


def example_shapes(state: PrepareState) -> PrepareState:
    """Route, prepack and tune for the batch the user gave, not the capture's: the example's
    shapes on the graph's nodes where a batch of one was captured as two."""
    if state.repeated:
        try:
            record_example_shapes(state.gm, tuple(state.example_args), state.example_kwargs)
        except Exception as exc:  # noqa: BLE001  (the hints still give a valid, if less tuned, route)
            warnings.warn(f"the captured graph did not run on the batch-1 example ({type(exc).__name__}: {exc}); "
                          "layers are routed for a batch of 2", RuntimeWarning, stacklevel=5)
    return state


def fold_batchnorms(state: PrepareState) -> PrepareState:
    """BatchNorm folded into the conv / linear before it (lowering/fold.py)."""
    state.folded = fold_batchnorm(state.gm)
    return state


def equalize_layers(state: PrepareState) -> PrepareState:
    """Cross-layer equalization of conv / linear pairs through ReLU (lowering/equalize.py), where
    the config asks for it (model-wide: the top-level config's setting)."""
    if state.config.equalization:
        equalize(state.gm)
    return state


def match_layers(state: PrepareState) -> PrepareState:
    """Which conv2d / linear calls become int8 ops, with the residual add and activation they
    absorb (lowering/patterns.py)."""
    state.ops, skipped = match(state.gm, state.model, state.config)
    state.skipped.extend(skipped)
    return state


def match_tables(state: PrepareState) -> PrepareState:
    """Which embedding lookups become rowwise-quantized tables (lowering/embeddings.py)."""
    state.embeddings, skipped = match_embeddings(state.gm, state.model, state.config)
    state.skipped.extend(skipped)
    return state


def plan_values(state: PrepareState) -> PrepareState:
    """Which values are observed and which flow in int8 (lowering/plan.py)."""
    state.plan = make_plan(state.ops)
    return state


def smoothing_groups(state: PrepareState) -> PrepareState:
    """SmoothQuant's candidate values and the Linears reading each (lowering/smoothquant.py);
    before the observers, since the LayerNorm fold looks at a value's users."""
    if resolve(state.config.smoothquant) is not None:
        groups = find_groups(state.plan, state.ops, layer_norm_only=state.config.smoothquant == "auto")
        for i, (value, readers) in enumerate(groups.items()):
            state.smooth_groups.append(SmoothGroup(value, readers, f"{STATS_PREFIX}{i}", fold_kind(value, readers)))
    return state


def token_candidates(state: PrepareState) -> PrepareState:
    """The values their Linears may read per token (lowering/per_token.py), each with the name of
    the row sample recorded beside it."""
    groups = per_token.find_groups(state.plan, state.ops)
    for i, (value, readers) in enumerate(groups.items()):
        state.token_groups.append(TokenGroup(value, readers, f"{per_token.ROWS_PREFIX}{i}"))
    return state


def insert_observers(state: PrepareState) -> PrepareState:
    """An observer (the op's config's activation observer) on every value the plan observes; 7-bit
    (reduce_range) where a layer reading the value has no provider that multiplies full-range 8-bit
    activations exactly on this CPU (a grouped conv without VNNI), unless its config says otherwise."""
    seven_bit = _seven_bit_values(state)
    for i, (node, name) in enumerate(state.plan.observed.items()):
        spec = _observer_spec_for(state.plan, node)
        if node in seven_bit and "reduce_range" not in spec.kwargs:
            spec = dataclasses.replace(spec, kwargs={**spec.kwargs, "reduce_range": True})
        _record_after(state.gm, node, f"{OBSERVER_PREFIX}{i}", ActivationObserver(spec.create(name)))
    return state


def _seven_bit_values(state: PrepareState) -> set:
    """The observed values (roots) a static layer reads as its input where that layer takes 7-bit
    inputs here (patterns' seven_bit_input: no exact 8-bit route, or 7 bits buy speed)."""
    values = set()
    for op in state.plan.ops:
        if op.config.mode != "static":
            continue
        if op.seven_bit_input(state.gm):
            values.add(root(op.x, state.plan.static_outputs))
    return values


def insert_channel_stats(state: PrepareState) -> PrepareState:
    """SmoothQuant's per-channel statistics beside each candidate value's observer."""
    sq = resolve(state.config.smoothquant)
    for group in state.smooth_groups:
        _record_after(state.gm, group.value, group.stats, ChannelStats(state.plan.observed[group.value],
                                                                       sq.sample_rows))
    return state


def insert_row_samples(state: PrepareState) -> PrepareState:
    """A uniform sample of each per-token candidate's rows (ChannelStats), for convert's choice."""
    for group in state.token_groups:
        _record_after(state.gm, group.value, group.stats, ChannelStats(state.plan.observed[group.value],
                                                                       per_token.SAMPLE_ROWS))
    return state


def insert_hessian_stats(state: PrepareState) -> PrepareState:
    """The input statistics recorder (HessianStats: GPTQ's H = X^T X, and the mean for bias
    correction) on the input of every static Linear and conv whose config rounds by GPTQ or
    corrects its bias: one per input value and conv geometry, shared by the layers reading it;
    the mean alone where only the bias is corrected, H would be too large, or a conv's example
    batch has too few output positions to determine it (gptq.conv_takes_gptq)."""
    by_key = {}
    for op in state.ops:
        cfg = op.config
        if op.kind not in ("linear", "conv2d") or cfg.mode != "static" \
                or not (cfg.weight_rounding == "gptq" or cfg.bias_correction):
            continue
        weight = get_attr_value(state.gm, op.weight)
        features = weight[0].numel()
        second = cfg.weight_rounding == "gptq" and features <= MAX_FEATURES
        conv = None
        if op.kind == "conv2d":
            g = op.geometry
            conv = {"kernel": tuple(weight.shape[2:]), "stride": tuple(g["stride"]), "padding": tuple(g["padding"]),
                    "dilation": tuple(g["dilation"]), "groups": int(g["groups"])}
            second = second and conv_takes_gptq(example_shape(op.x), conv, features)
        key = (op.x, second, None if conv is None else tuple(sorted(conv.items())))
        if key not in by_key:
            by_key[key] = f"{HESSIAN_PREFIX}{len(by_key)}"
            _record_after(state.gm, op.x, by_key[key], HessianStats(f"{op.name}.input", conv, second))
        state.hessians[op.name] = by_key[key]
    return state


def prepared_graph(state: PrepareState) -> PreparedGraph:
    """The prepared graph of a state the passes have filled."""
    state.gm.recompile()
    return PreparedGraph(state.gm, state.ops, state.plan, state.skipped, state.folded, state.embeddings,
                         state.smooth_groups, state.config, state.hessians, state.token_groups)
