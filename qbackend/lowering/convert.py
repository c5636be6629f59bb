"""The passes of convert (their order: lowering/pipeline.py CONVERT): rewrite a calibrated
PreparedGraph into the int8 model. Each pass takes the ConvertState and hands it on.

Works on a copy of the prepared GraphModule (parameters shared, not copied; the prepared model
stays usable). In the order the fused chains end:

* each static op becomes one call of its qbackend.nn module (static Linears' and convs' weights
  rounded by GPTQ on their input's calibration Hessian unless the config says "nearest", their bias
  corrected for the rounding as its bias_correction setting says: algorithms/gptq.py),
  placed where its chain ended, fed the int8 form of its input (and residual): the output of the
  producing int8 op, a transparent op (max pool, view, flatten) re-run on int8 data, or a quantize
  op right after the observed float value. Its output is int8 where the plan says some consumer reads int8; float consumers
  of an int8 value get one dequantize op, shared;
* dynamic and weight-only ops become their module, float in and out; so do static Linears chosen
  to read their input per token (lowering/per_token.py: TokenQuantizedLinear), whose producer then
  writes float32;
* a flatten of a channels-last int8 value that only static Linears read reads it in NHWC order,
  the Linears' weight columns permuted to match (lowering/nhwc_flatten.py);
* shape queries of a float value read its int8 form (same shape), so that float ops kept only
  for their shape die too;
* the float chain that was replaced, and the observers, are dropped (dead code);
* attention cores (torch's SDPA) become qbackend's fused attention, with the quantize of their
  output folded in (lowering/attention.py); a LayerNorm whose output is quantized becomes one
  (add +) LayerNorm + quantize op (lowering/layer_norm.py); a global average pool between an
  int8 layer output and a quantize becomes one int8 pool (lowering/global_pool.py).

Every compute op left in FP32 (by op name and count), and every conv/linear that could not be
quantized, with the reason, is listed in one warning (FP32FallbackWarning).
"""
from __future__ import annotations

import copy
import dataclasses
import operator
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx

from ..observers import QParams
from ..observers import outliers
from ..ops import reference
from ..nn import QuantizedConv2d, QuantizedLinear
from ..nn.quant import Dequantize, Quantize
from ..config import QuantConfig
from .attention import attention_route, fuse_attention
from .layer_norm import fuse_layer_norms
from .global_pool import fuse_global_pools
from .inverted_residual import fuse_inverted_residuals
from .embeddings import rewrite_embeddings
from ..algorithms import gptq
from ..algorithms import smoothquant as smoothing_search
from ..algorithms.gptq import HessianStats
from .graph_utils import module_of, positional_inputs
from .input_layout import quantize_channels_last
from .layers import build_layer
from .records import activation_record, layer_record
from .patterns import ANCHORS, MATMUL_LIKE, TRANSPARENT
from . import nhwc_flatten, smoothquant
from .fold import get_attr_value
from .plan import Plan, is_transparent, make_plan
from . import per_token
from .prepare import ActivationObserver, PreparedGraph

ops_ns = torch.ops.qbackend
aten = torch.ops.aten
# Views of the FP32 graph become reshapes in the int8 one: qbackend's convs write channels-last
# (int8 and float outputs alike) where the FP32 tensor a view was captured on was contiguous, and
# a reshape is the same view where the strides allow one.
_AS_RESHAPE = {aten.view.default: aten.reshape.default, aten._unsafe_view.default: aten.reshape.default}
# Transparent ops whose int8 form is another op: views as above; max pooling is qbackend's (aten's
# refuses channels-last int8). Same arguments, same values.
_INT8_FORM = {**_AS_RESHAPE, aten.max_pool2d.default: ops_ns.max_pool2d.default}


class FP32FallbackWarning(UserWarning):
    """Some ops of the model stay in FP32 (listed in the message)."""


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, prepared: PreparedGraph, qparams: dict, value_ids: dict, tune=None):
        self.gm, self.graph, self.prepared, self.qparams = gm, gm.graph, prepared, qparams
        self.tune = tune
        self.value_ids = value_ids  # id(QParams) -> the activation value's name
        self.borders = 0
        self.qmap: dict[fx.Node, tuple[fx.Node, QParams]] = {}
        self.layers: dict[str, dict] = {}
        self.dequantized: dict[fx.Node, fx.Node] = {}  # dequantize node -> the int8 output's original node
        self.replaced: dict[fx.Node, fx.Node] = {}     # original output node -> the float node now in its place
        self.placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.channel_smooth: dict[fx.Node, torch.Tensor] = {}  # value -> s, divided in its quantize op
        self.weight_smooth: dict[str, torch.Tensor] = {}       # layer name -> s, multiplied into its weight
        self.hessians: dict[str, tuple[str, torch.Tensor | None, torch.Tensor | None]] = {}  # layer -> (its
        # input's recorder, H and E[x] unsmoothed)
        self._factors: dict[tuple, tuple] = {}                  # (recorder, smoothing) -> (H, gptq.factor(H))
        self.nhwc: dict[fx.Node, tuple] = {}  # flatten read as NHWC -> (C, H*W) of the value it flattens
        self.per_token: dict[str, dict] = {}  # layer name -> its per-token choice (lowering/per_token.py)

    def _after(self, node: fx.Node):
        if node.op == "placeholder":
            node = self.placeholders[-1]
        return self.graph.inserting_after(node)

    def int8(self, value: fx.Node) -> tuple[fx.Node, QParams]:
        """The int8 form of a float value (made on first use)."""
        value = self.dequantized.get(value, value)  # a float read of an int8 output we made
        if value in self.qmap:
            return self.qmap[value]
        if value not in self.qparams and is_transparent(value):
            src, qp = self.int8(value.args[0])
            target = _INT8_FORM.get(value.target, value.target)
            with self.graph.inserting_after(value):
                node = self.graph.call_function(target, (src, *value.args[1:]), dict(value.kwargs))
            node.meta = {k: v for k, v in value.meta.items() if k != "val"}  # not the float value's dtype
            self.qmap[value] = (node, qp)
            return self.qmap[value]
        qp = self.qparams[value]
        if value in self.prepared.plan.int8_cats:
            # cat of the inputs, each in int8 with the cat's qparams (the layers producing them were
            # given these qparams by the plan, so they usually are already)
            parts = [self.int8_with(part, qp) for part in value.args[0]]
            with self.graph.inserting_after(value):
                node = self.graph.call_function(value.target, (parts, *value.args[1:]), dict(value.kwargs))
        else:
            node = self._quantize(self.replaced.get(value, value), qp, self.channel_smooth.get(value))
        self.qmap[value] = (node, qp)
        return self.qmap[value]

    def int8_with(self, value: fx.Node, qp: QParams) -> fx.Node:
        """value in int8 with the given qparams: its int8 form if it has them, else quantized so."""
        value = self.dequantized.get(value, value)
        if value in self.qmap and self.qmap[value][1] == qp:
            return self.qmap[value][0]
        return self._quantize(self.replaced.get(value, value), qp)

    def _quantize(self, src: fx.Node, qp: QParams, smooth: torch.Tensor | None = None) -> fx.Node:
        """A Quantize module call right after the float value src (dividing channel c by smooth[c]
        first, when given: SmoothQuant)."""
        top = reference.QRANGE[qp.dtype][1]
        module = Quantize(qp.scale, qp.zero_point, qp.dtype, qp.qmax if qp.qmax < top else None,
                          value=self.value_ids[id(qp)], channel_divisor=smooth)
        with self._after(src):
            return self.graph.call_module(self._add_border("quantize", module), (src,))

    def _add_border(self, kind: str, module) -> str:
        name = f"qbackend_{kind}_{self.borders}"
        self.borders += 1
        self.gm.add_submodule(name, module)
        return name

    def _hessian(self, layer: str, smooth: torch.Tensor | None) -> tuple:
        """(H, gptq.factor(H)) of the layer's input as the int8 layer reads it (smoothed by SmoothQuant:
        X / s has H' = diag(1/s) H diag(1/s)); factored once per input and smoothing (query, key and
        value share theirs)."""
        stats, h, _ = self.hessians[layer]
        key = (stats, None if smooth is None else id(smooth))
        if key not in self._factors:
            if smooth is not None:
                inv = 1.0 / smooth.double()
                h = h * inv[:, None] * inv[None, :]
            self._factors[key] = (h, gptq.factor(h) if h.dim() == 2 else None)
        return self._factors[key]

    def rewrite(self, op) -> None:
        plan = self.prepared.plan
        token = self.per_token.get(op.name)
        static = op.config.mode == "static" and token is None
        args, x_qp, acc_qp = (), None, None
        if static:
            xq, x_qp = self.int8(op.x)
            args = (xq,)
            if op.accum is not None:
                aq, acc_qp = self.int8(op.accum)
                args = (xq, aq)
        else:
            args = (self.replaced.get(op.x, op.x),)
        out_qp = self.qparams[op.output] if op.output in plan.int8_outputs else None
        spec = op.layer_spec(self.gm)
        smooth = self.weight_smooth.get(op.name)
        if smooth is not None:
            spec.weight = smoothing_search.smoothed_weight(spec.weight, smooth)
        if op.name in self.hessians:
            _, h, mean = self.hessians[op.name]
            if h is not None:
                spec.hessian, spec.hessian_factor = self._hessian(op.name, smooth)
            if mean is not None:
                spec.input_mean = mean if smooth is None else mean / smooth.double()
        if op.accum is not None:
            spec.residual = "int8" if out_qp is not None else "float32"
        if static and op.x in self.nhwc:
            spec.column_order = nhwc_flatten.column_order(*self.nhwc[op.x])
        spec.per_token = token
        module, r = build_layer(spec, x_qp, out_qp, acc_qp, tune=self.tune)
        if static and op.x in self.nhwc:
            module.x_nhwc = self.nhwc[op.x]
        if static:
            module.x_value = self.value_ids[id(x_qp)]
            module.out_value = self.value_ids[id(out_qp)] if out_qp is not None else None
            module.accum_value = self.value_ids[id(acc_qp)] if acc_qp is not None else None
        target = "qlayer_" + op.name.replace(".", "_").replace("@", "_call")
        self.gm.add_submodule(target, module)
        with self.graph.inserting_after(op.output):
            call = self.graph.call_module(target, args)
        call.meta["qbackend_layer"] = op.name
        self.layers[op.name] = layer_record(spec, target, r, "int8" if out_qp is not None else "float32",
                                            by_batch=op.config.route_by_batch and self.tune is None)
        if out_qp is not None:
            self.qmap[op.output] = (call, out_qp)
            deq_mod = Dequantize(out_qp.scale, out_qp.zero_point, out_qp.dtype, value=self.value_ids[id(out_qp)])
            with self.graph.inserting_after(call):
                deq = self.graph.call_module(self._add_border("dequantize", deq_mod), (call,))
            op.output.replace_all_uses_with(deq)
            self.dequantized[deq] = op.output
            self.replaced[op.output] = deq
        else:
            if isinstance(op.output.meta.get("val"), torch.Tensor):  # the float output: same shape and dtype
                call.meta["val"] = op.output.meta["val"]
            op.output.replace_all_uses_with(call)
            self.replaced[op.output] = call


def _compute_qparams(prepared: PreparedGraph) -> tuple[dict, dict, dict]:
    """(node -> QParams, id(QParams) -> value name, the activation table: value name -> the float
    range and quantization settings its qparams came from); each observer's range searched once."""
    by_name = prepared.observers()
    qparams, value_ids, table, ranges = {}, {}, {}, {}
    for node, name in prepared.plan.observed.items():
        obs = by_name[name]
        if name not in ranges:
            ranges[name] = obs.chosen_range()
        qp = obs.qparams_for_range(*ranges[name])
        qparams[node], value_ids[id(qp)] = qp, name
        table[name] = activation_record(obs, qp, ranges[name])
    for node, cat in prepared.plan.aliases.items():  # layer outputs that only feed an int8 cat
        qparams[node] = qparams[cat]
    return qparams, value_ids, table


def _search_smoothing(prepared: PreparedGraph, qparams: dict, value_ids: dict, table: dict) -> dict:
    """SmoothQuant's search for each candidate value (algorithms/smoothquant.py): node -> Smoothing
    for the values it smooths; their qparams and activation-table entries become the smoothed
    value's, and every candidate's table entry says what the search found."""
    chosen = {}
    observers = prepared.observers()
    for group in prepared.smooth_groups:
        name = prepared.plan.observed[group.value]
        sm = smoothing_search.choose(group.fold, prepared.gm.get_submodule(group.stats), observers[name],
                                [get_attr_value(prepared.gm, op.weight) for op in group.ops],
                                [op.config for op in group.ops], [op.name for op in group.ops],
                                smoothing_search.resolve(prepared.config.smoothquant))
        table[name].smoothquant = sm.info()
        if sm.factors is not None:
            qparams[group.value], value_ids[id(sm.qparams)] = sm.qparams, name
            table[name].range = list(sm.range)
            chosen[group.value] = sm
    return chosen


@dataclass
class ConvertState:
    """What the convert passes read and write, in the order they fill it: the calibrated prepared
    graph, tune mode's options, whether to warn about FP32 ops; each observed value's qparams,
    its name and its activation record; SmoothQuant's choices; the Linears reading their input per
    token and the plan made with them (else the prepared graph's); the graph being rewritten (a copy)
    with the prepared graph's ops and plan on its nodes; the rewriter and the layer records."""

    prepared: PreparedGraph
    tune: object = None
    warn: bool = True
    qparams: dict = field(default_factory=dict)
    value_ids: dict = field(default_factory=dict)
    activations: dict = field(default_factory=dict)
    smoothed: dict = field(default_factory=dict)
    plan: Plan | None = None
    per_token: dict = field(default_factory=dict)
    gm: fx.GraphModule | None = None
    node_map: dict = field(default_factory=dict)
    rewriter: _Rewriter | None = None
    layers: dict = field(default_factory=dict)


def qparams_from_observers(state: ConvertState) -> ConvertState:
    """Each observed value's qparams and activation record (ObserverError names a value without data)."""
    state.qparams, state.value_ids, state.activations = _compute_qparams(state.prepared)
    return state


def search_smoothing(state: ConvertState) -> ConvertState:
    """SmoothQuant's factors for each candidate value (algorithms/smoothquant.py)."""
    state.smoothed = _search_smoothing(state.prepared, state.qparams, state.value_ids, state.activations)
    return state


def choose_per_token(state: ConvertState) -> ConvertState:
    """Which Linears read their input per token (lowering/per_token.py). Where any does, the plan is
    made again with those Linears reading float: the values they alone read are no longer quantized
    (their producers write float32), and leave the activation table."""
    prepared = state.prepared
    state.per_token = per_token.choose(prepared.token_groups, prepared.gm, state.qparams)
    state.plan = prepared.plan
    if state.per_token:
        plan = make_plan(prepared.plan.ops, frozenset(state.per_token))
        for node, name in prepared.plan.observed.items():
            if node not in plan.observed:
                del state.qparams[node]
                state.activations.pop(name, None)
            elif plan.observed[node] != name:
                raise RuntimeError(f"qbackend internal error: {name} renamed {plan.observed[node]} by the per-token plan")
        state.plan = plan
    return state


def warn_calibration_outliers(state: ConvertState) -> ConvertState:
    """One CalibrationOutlierWarning naming every activation whose chosen range a few outlying
    calibration values dominate (observers/outliers.py); values SmoothQuant smoothed are left out
    (their qparams are the smoothed value's)."""
    if not state.warn:
        return state
    smoothed = {state.prepared.plan.observed[node] for node in state.smoothed}
    quantized = set(state.plan.observed.values())
    tails = state.prepared.tail_histograms()
    findings = []
    for name, obs in state.prepared.observers().items():
        if name in smoothed or name not in quantized:
            continue
        record = state.activations.get(name)  # unsmoothed: its range is the observer's chosen range
        found = outliers.find_outlier_range(obs, tails.get(name), record.range if record is not None else None)
        if found is not None:
            findings.append(found)
    outliers.warn_outliers(findings, stacklevel=6)  # the caller of qbackend.convert
    return state


def copy_graph(state: ConvertState) -> ConvertState:
    """The graph to rewrite: a copy of the prepared one (parameters shared, not copied: the
    prepared model stays usable), with the ops, the plan and the qparams on its nodes. The
    recorders are shared too: convert reads them from the prepared graph and drops them from the
    copy (drop_recorders), and their statistics are large (GPTQ's fp64 H: about 1 GB on BERT-base,
    whose copy cost 2 s)."""
    src = state.prepared.gm
    memo = {id(t): t for t in list(src.parameters()) + list(src.buffers())}
    memo.update((id(m), m) for m in src.children() if isinstance(m, _RECORDERS))
    state.gm = copy.deepcopy(src, memo)
    state.node_map = node_map = dict(zip(src.graph.nodes, state.gm.graph.nodes))
    state.qparams = {node_map[n]: qp for n, qp in state.qparams.items()}
    plan = copy.copy(state.plan)
    plan.aliases = {node_map[k]: node_map[v] for k, v in state.plan.aliases.items()}
    plan.int8_cats = {node_map[n] for n in state.plan.int8_cats}
    plan.int8_outputs = {node_map[n] for n in state.plan.int8_outputs}
    state.rewriter = _Rewriter(state.gm, _Prepared(plan), state.qparams, state.value_ids, state.tune)
    state.rewriter.per_token = dict(state.per_token)
    return state


def apply_smoothing(state: ConvertState) -> ConvertState:
    """SmoothQuant's factors: into the LayerNorm's weight and bias, or into the value's quantize op;
    the Linears reading the value get weights W s when they are built."""
    rw = state.rewriter
    for group in state.prepared.smooth_groups:
        sm = state.smoothed.get(group.value)
        if sm is None:
            continue
        for op in group.ops:
            rw.weight_smooth[op.name] = sm.factors
        if sm.fold == "layer_norm":
            smoothquant.fold_layer_norm(state.gm, state.node_map[group.value], sm.factors)
        else:
            rw.channel_smooth[state.node_map[group.value]] = sm.factors
    return state


def attach_hessians(state: ConvertState) -> ConvertState:
    """Each static layer's input statistics: GPTQ's H for its weight rounding, E[x] for its bias
    correction."""
    for layer, stats in state.prepared.hessians.items():
        rec = state.prepared.gm.get_submodule(stats)
        if rec.hessian is not None or rec.mean() is not None:
            state.rewriter.hessians[layer] = (stats, rec.hessian, rec.mean())
    return state


# The calibration-time modules that convert drops: observers and statistics recorders.
_RECORDERS = (ActivationObserver, smoothing_search.ChannelStats, HessianStats)


def _recorder_test(gm: fx.GraphModule):
    """node -> whether it calls one of gm's recorders (_RECORDERS)."""
    return lambda node: module_of(gm, node, _RECORDERS) is not None


def plan_nhwc_flattens(state: ConvertState) -> ConvertState:
    """The flattens of channels-last int8 values that only static Linears read: read as NHWC, the
    Linears' weight columns permuted to match (lowering/nhwc_flatten.py)."""
    ops = [_remap(op, state.node_map) for op in state.prepared.ops]
    state.rewriter.nhwc = nhwc_flatten.plan(ops, state.qparams, state.rewriter.prepared.plan.int8_outputs,
                                            _recorder_test(state.gm))
    return state


def rewrite_layers(state: ConvertState) -> ConvertState:
    """Each matched op becomes one call of its qbackend.nn module, in the order the chains end
    (the module docstring)."""
    order = {n: i for i, n in enumerate(state.gm.graph.nodes)}
    for op in sorted((_remap(op, state.node_map) for op in state.prepared.ops), key=lambda o: order[o.output]):
        state.rewriter.rewrite(op)
    state.layers = state.rewriter.layers
    return state


def rewrite_tables(state: ConvertState) -> ConvertState:
    """Each matched embedding lookup becomes its rowwise-quantized module (lowering/embeddings.py)."""
    nm = state.node_map
    state.layers.update(rewrite_embeddings(state.gm, [dataclasses.replace(e, node=nm[e.node], weight=nm[e.weight])
                                                      for e in state.prepared.embeddings]))
    return state


def read_flattens_as_nhwc(state: ConvertState) -> ConvertState:
    """The int8 form of each planned flatten reads its channels-last input as [N, H, W, C] (the
    Linears reading it were built with their columns in that order)."""
    rw = state.rewriter
    for flat in rw.nhwc:
        flat8 = rw.qmap[flat][0]
        if not all(module_of(state.gm, u, QuantizedLinear) is not None and u.args == (flat8,) for u in flat8.users):
            raise RuntimeError(f"qbackend internal error: {flat8.name} is read by more than the Linears planned")
        nhwc_flatten.read_as_nhwc(state.gm.graph, flat8)
    return state


# Queries of a tensor's shape alone: the int8 form of a value (same shape) answers them as well.
# Not strides or storage offsets (int8 forms may be laid out otherwise).
_SHAPE_QUERIES = frozenset({aten.sym_size.int, aten.sym_size.default, aten.sym_numel.default, aten.size.int,
                            aten.size.default, aten.numel.default, aten.dim.default})


def shapes_from_int8(state: ConvertState) -> ConvertState:
    """Shape queries of a float value that has an int8 form read the int8 form instead, so that a
    float chain (a dequantize, a float max pool) kept only for its shape dies with the rest of the
    replaced float graph. The int8 forms have the float value's shape: the layer's output, a
    quantize of the value, an int8 cat of its parts, a transparent op re-run on int8 data."""
    rw = state.rewriter
    order = {n: i for i, n in enumerate(state.gm.graph.nodes)}
    for node in list(state.gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SHAPE_QUERIES or not isinstance(node.args[0], fx.Node):
            continue
        value = node.args[0]
        int8 = rw.qmap.get(rw.dequantized.get(value, value))
        if int8 is not None and int8[0] is not value and order[int8[0]] < order[node]:
            node.args = (int8[0], *node.args[1:])
    return state


def drop_recorders(state: ConvertState) -> ConvertState:
    """The observers and statistics recorders go, with export's input guards (the kernels check
    shapes), and the float chains the int8 modules replaced (dead code)."""
    gm = state.gm
    is_recorder = _recorder_test(gm)
    for node in list(gm.graph.nodes):
        if is_recorder(node):
            gm.graph.erase_node(node)
    for name, m in list(gm.named_children()):
        if isinstance(m, _RECORDERS):
            delattr(gm, name)
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    return state


def fuse_float_cores(state: ConvertState) -> ConvertState:
    """Attention cores (where routed to the fused kernel: lowering/attention.py), LayerNorms whose
    output is quantized (lowering/layer_norm.py) and global average pools between int8 values
    (lowering/global_pool.py), each with the quantize behind it."""
    config = state.prepared.config or QuantConfig()
    native = attention_route(config.attention).provider == "native"
    fused = fuse_attention(state.gm, bf16_products=config.bf16) if native else 0
    if fused + fuse_layer_norms(state.gm) + fuse_global_pools(state.gm):
        state.gm.graph.eliminate_dead_code()
    return state


def channels_last_inputs(state: ConvertState) -> ConvertState:
    """Quantizes read only by convs write channels-last int8 (lowering/input_layout.py)."""
    quantize_channels_last(state.gm)
    return state


def views_as_reshapes(state: ConvertState) -> ConvertState:
    """Every view left in the graph becomes a reshape (see _AS_RESHAPE)."""
    for node in state.gm.graph.nodes:
        if node.op == "call_function" and node.target in _AS_RESHAPE:
            node.target = _AS_RESHAPE[node.target]
    return state


def check_and_warn(state: ConvertState) -> ConvertState:
    """The graph checked and recompiled; one warning listing what stays in FP32."""
    state.gm.graph.lint()
    state.gm.recompile()
    if state.warn:
        _warn_fp32(state.gm, state.prepared.skipped)
    return state


def plain_graph(gm: fx.GraphModule) -> tuple[fx.GraphModule, object, object]:
    """(a plain GraphModule over flat inputs and outputs, the input and output pytree specs).

    The GraphModule torch.export gives is a stateful subclass with hooks that do not pickle; this
    one pickles (as its code plus its modules) and re-traces when loaded."""
    graph = copy.deepcopy(gm.graph)
    in_spec, out_spec = gm._in_spec, gm._out_spec
    graph._codegen = fx.graph.CodeGen()
    graph._tracer_cls, graph._tracer_extras = None, {}
    root = {}
    for node in graph.nodes:
        if node.op == "call_module":
            root[node.target] = gm.get_submodule(node.target)
        elif node.op == "get_attr":
            owner, _, attr = node.target.rpartition(".")
            root[node.target] = getattr(gm.get_submodule(owner) if owner else gm, attr)
    plain = fx.GraphModule(root, graph, class_name="QuantizedGraph")
    # The model's own names of its positional inputs (the export's forward signature), so that the
    # QuantizedModel takes them by keyword too.
    inputs = positional_inputs(gm)
    plain.meta["arg_names"] = inputs[0] if inputs is not None else None
    return plain, in_spec, out_spec


def donate_dead_residuals(state: ConvertState) -> ConvertState:
    """Let each residual conv write into its int8 residual input when nothing reads that input later:
    the input must be a fresh tensor (made by a quantized layer, a Quantize border or int8 max
    pooling; never a graph input, a view or an output) and every other reader must come before the
    conv in the graph, and it must not be the conv's own input (conv(x) + x: the conv would overwrite
    the x it is still reading). Saves one copy of the residual per call (oneDNN's sum post-op)."""
    gm = state.gm
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    fresh_modules = (QuantizedConv2d, QuantizedLinear, Quantize)
    for node in gm.graph.nodes:
        module = module_of(gm, node, QuantizedConv2d)
        if module is None or len(node.args) != 2 or not module.has_accum:
            continue
        x, acc = node.args
        if acc is x:
            continue
        fresh = module_of(gm, acc, fresh_modules) is not None or \
            (acc.op == "call_function" and acc.target is ops_ns.max_pool2d.default)
        if fresh and all(order[u] < order[node] for u in acc.users if u is not node):
            module.accum_donated = True
    return state


def drop_unused_attributes(state: ConvertState) -> ConvertState:
    """Delete the float weights the int8 layers replaced (and empty module shells)."""
    gm = state.gm
    used = {n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name not in used:
            owner, _, attr = name.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            if type(mod).__module__.startswith("qbackend."):
                continue  # the state of qbackend's own modules (a Quantize's SmoothQuant factors)
            delattr(mod, attr)
    gm.delete_all_unused_submodules()
    for name, mod in sorted(gm.named_modules(), key=lambda kv: -kv[0].count(".")):
        if name and not any(True for _ in mod.children()) and not any(True for _ in mod.parameters()) \
                and not any(True for _ in mod.buffers()) and type(mod) is torch.nn.Module and name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, attr)
    return state


def name_layers_by_path(state: ConvertState) -> ConvertState:
    """Move each int8 layer to its original module path ("layer1.0.conv1") when that path is free,
    so qmodel.get_submodule(name) finds it; its record keeps the final path (`module`)."""
    gm, layers = state.gm, state.layers
    calls = {n.target: n for n in gm.graph.nodes if n.op == "call_module"}
    for name, info in layers.items():
        path = name.replace("@", "_call")
        node = calls.get(info.module)
        if node is None or path == info.module:
            continue
        try:
            gm.get_submodule(path)
            continue  # something still lives there
        except AttributeError:
            pass
        owner, _, attr = path.rpartition(".")
        try:
            parent = gm.get_submodule(owner) if owner else gm
        except AttributeError:
            parent = None
        if parent is not None and type(parent) is not torch.nn.Module and parent is not gm:
            continue  # do not graft into a real module
        module = gm.get_submodule(info.module)
        delattr(gm, info.module)
        gm.set_submodule(path, module) if parent is not None else _set_path(gm, path, module)
        node.target = path
        info.module = path
    return state


def fuse_blocks(state: ConvertState) -> ConvertState:
    """Chains of int8 layers the fusion table lists for this CPU become one module and one native
    call (lowering/inverted_residual.py); their records say so."""
    fuse_inverted_residuals(state.gm, state.layers, state.prepared.config.fusions)
    return state


def _set_path(gm: fx.GraphModule, path: str, module) -> None:
    parent = gm
    for part in path.split(".")[:-1]:
        if not hasattr(parent, part):
            parent.add_module(part, torch.nn.Module())
        parent = getattr(parent, part)
    parent.add_module(path.rsplit(".", 1)[-1], module)


class _Prepared:
    def __init__(self, plan):
        self.plan = plan


def _remap(op, node_map):
    new = copy.copy(op)
    for name in ("anchor", "x", "weight", "bias", "accum", "output"):
        v = getattr(op, name)
        if v is not None:
            setattr(new, name, node_map[v])
    return new


_NOT_COMPUTE = {ops_ns.quantize_per_tensor.default, ops_ns.dequantize_per_tensor.default, aten.clamp_max.default,
                operator.getitem}


def fp32_ops(gm: fx.GraphModule) -> Counter:
    """The compute ops left in FP32 (float tensor results; views and reshapes not counted), by name."""
    c = Counter()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if (node.op == "call_function" and node.target not in _NOT_COMPUTE and node.target not in TRANSPARENT
                and isinstance(val, torch.Tensor) and val.is_floating_point()):
            c[_op_name(node)] += 1
    return c


def _op_name(node: fx.Node) -> str:
    t = node.target
    return getattr(t, "__name__", None) if not hasattr(t, "_schema") else str(t).replace("aten.", "").rsplit(".", 1)[0]


def _warn_fp32(gm: fx.GraphModule, skipped: list) -> None:
    borders = fp32_ops(gm)
    unquantized = Counter(_op_name(n) for n in gm.graph.nodes
                          if n.op == "call_function" and n.target in MATMUL_LIKE - set(ANCHORS))
    parts = []
    if borders:
        parts.append("kept in FP32: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(borders.items())))
    if skipped:
        parts.append("layers not quantized: " + "; ".join(f"{n} ({why})" for n, why in skipped))
    if unquantized:
        parts.append("matmul-like ops with no int8 pattern: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(unquantized.items())))
    if parts:
        warnings.warn("qbackend: some ops stay in FP32 — " + " | ".join(parts), FP32FallbackWarning, stacklevel=5)
