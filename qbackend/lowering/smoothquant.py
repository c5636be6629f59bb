"""SmoothQuant: move activation outliers into the weights of the Linears that read them.

For a float activation X [..., C] read by static Linears W_i [N_i, C] (a LayerNorm's output read by
a block's query, key and value projections, say), any per-channel factor s > 0 gives the same
product, X W^T = (X / s)(W s)^T. Dividing X's outlier channels by s makes X / s easier to
quantize per tensor; the weight columns grow instead, and weights are quantized per output
channel, which absorbs it better. s_c = max|X_c|^alpha / max_i max|W_i[:, c]|^(1 - alpha).

What this module does (settings: config.SmoothQuantConfig):

* which values (`find_groups`, at prepare): every float value quantized at a border (not produced
  in int8 by another op, not an int8 cat) whose int8 readers are all Linears reading it directly
  (no view in between), so that channel c of the value is column c of every weight; with
  QuantConfig.smoothquant="auto" (the default) only LayerNorm outputs (transformer blocks);
* calibration: `ChannelStats` beside the value's ordinary observer records per-channel absolute
  maxima and a uniform sample of rows;
* the search (`choose`, at convert): for no smoothing and for each alpha of the grid, the
  Linears' output error on the sample, sum over the Linears of |Q(X/s) Q(W s)^T - X W^T|^2 /
  |X W^T|^2, where Q(X/s) uses qparams from the configured activation observer fed X / s (no
  smoothing: the value's own observer, over all calibration data) and Q(W s) quantizes the
  weights as the int8 layers do. The best alpha wins if it beats no smoothing by `min_gain`;
* folding, at no run-time cost: where the value is the output of a LayerNorm that only those
  Linears read (pre-LN blocks), 1/s goes into the LayerNorm's weight and bias and the value is
  quantized per tensor; elsewhere (post-LN blocks such as BERT's, where the LayerNorm output is
  also the residual, so the float value itself must not change) the value's quantize op divides
  channel c by s_c: quantize_per_channel with scales scale * s, as fast as per tensor.
  `fold_fp32` applies either fold to the float graph alone (the exactness check).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import fx, nn

from ..config import QuantConfig, SmoothQuantConfig
from ..nn.weights import quantize_weight
from ..observers import Observer, QParams
from .fold import get_attr_value, register_constant
from .graph_utils import is_float_tensor
from .plan import Plan, root

aten = torch.ops.aten
STATS_PREFIX = "qbackend_channel_stats_"
_S_MIN, _S_MAX = 1e-5, 1e5  # smoothing factors are clamped to this range


class ChannelStats(nn.Module):
    """A graph node recording, for a value [..., C], each channel's largest |x| and a uniform sample
    of up to `sample_rows` rows (priority sampling: every row gets a random key, the smallest keys
    are kept, so the sample is uniform over all rows seen whatever the batch sizes). Rows with NaN
    or inf are skipped (the value's observer reports them)."""

    def __init__(self, name: str, sample_rows: int, seed: int = 0):
        super().__init__()
        self.name, self.sample_rows = name, int(sample_rows)
        self.generator = torch.Generator().manual_seed(seed)
        self.absmax: torch.Tensor | None = None
        self.sample: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None
        self.rows_seen = 0

    def forward(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
            return
        rows = x.detach().reshape(-1, x.shape[-1]).float()
        finite = torch.isfinite(rows).all(dim=1)
        if not bool(finite.all()):
            rows = rows[finite]
        if rows.shape[0] == 0:
            return
        amax = rows.abs().amax(dim=0)
        self.absmax = amax if self.absmax is None else torch.maximum(self.absmax, amax)
        self.rows_seen += rows.shape[0]
        keys = torch.rand(rows.shape[0], generator=self.generator)
        if self.sample is not None:
            rows, keys = torch.cat([self.sample, rows]), torch.cat([self.keys, keys])
        if rows.shape[0] > self.sample_rows:
            keep = keys.topk(self.sample_rows, largest=False).indices
            rows, keys = rows[keep], keys[keep]
        self.sample, self.keys = rows.clone(), keys.clone()

    def extra_repr(self) -> str:
        return f"{self.name}: rows seen {self.rows_seen}, sampled {0 if self.sample is None else len(self.sample)}"


@dataclass
class SmoothGroup:
    """A value to smooth and the Linears that read it (in the prepared graph)."""

    value: fx.Node
    ops: list            # the QuantizableOps (linear, static) reading it
    stats: str           # the ChannelStats submodule's name
    fold: str            # "layer_norm" | "quantize"


@dataclass
class Smoothing:
    """What the search chose for one value."""

    value: str                     # the value's observer name
    factors: torch.Tensor | None   # s (float32 [C]); None: not smoothed
    alpha: float | None
    error: float                   # the Linears' relative output error on the sample, chosen
    error_unsmoothed: float        # the same without smoothing
    fold: str
    qparams: QParams | None = None  # the smoothed value's qparams (None: not smoothed)
    range: tuple[float, float] | None = None

    def info(self) -> dict:
        return {"alpha": self.alpha, "fold": self.fold if self.factors is not None else None,
                "error": self.error, "error_unsmoothed": self.error_unsmoothed}


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


def resolve(setting) -> SmoothQuantConfig | None:
    """QuantConfig.smoothquant -> the settings to use ("auto": the defaults), or None (off)."""
    return SmoothQuantConfig() if setting == "auto" else setting


def find_groups(plan: Plan, ops: list, layer_norm_only: bool = False) -> dict[fx.Node, list]:
    """value -> the static Linears reading it, for every value that can be smoothed (module
    docstring; layer_norm_only: LayerNorm outputs only, QuantConfig.smoothquant="auto"). Observer
    nodes must not have been added yet (the LayerNorm fold looks at users)."""
    readers: dict[fx.Node, list] = {}
    for op in ops:
        if op.config.mode != "static":
            continue
        for value, what in ((op.x, "input"), (op.accum, "residual")):
            if value is not None:
                readers.setdefault(root(value, plan.static_outputs), []).append((op, what, value))
    groups = {}
    for r, lst in readers.items():
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


def _fake_quant_act(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    q = torch.clamp(torch.round(x / qp.scale) + qp.zero_point, qp.qmin, qp.qmax)
    return (q - qp.zero_point) * qp.scale


def _fake_quant_weight(w: torch.Tensor, config: QuantConfig, name: str) -> torch.Tensor:
    q, scales = quantize_weight(w, config.weight.create(f"{name}.weight"), name)
    return q.float() * scales[:, None]


def _column_max(weights: list[torch.Tensor]) -> torch.Tensor:
    """max over the Linears and their rows of |w[:, c]|: [C]."""
    return torch.stack([w.detach().float().abs().amax(dim=0) for w in weights]).amax(dim=0)


def _factors(absmax: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    a, w = absmax.float().clamp_min(1e-5), w_max.clamp_min(1e-5)
    return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp(_S_MIN, _S_MAX)


def factors_for(absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s_c = max|x_c|^alpha / max|w_c|^(1 - alpha), clamped to [1e-5, 1e5] (channels that are
    all zero in x or in every weight get finite factors)."""
    return _factors(absmax, _column_max(weights), alpha)


@torch.no_grad()
def choose(group: SmoothGroup, stats: ChannelStats, observer: Observer, weights: list[torch.Tensor],
           configs: list[QuantConfig], names: list[str], sq: SmoothQuantConfig) -> Smoothing:
    """The search of the module docstring, for one value. `observer` is the value's own (calibrated)
    observer; `weights` the float weights of the Linears reading it."""
    name = observer.name
    if stats.sample is None or stats.absmax is None:
        return Smoothing(name, None, None, float("nan"), float("nan"), group.fold)
    x = stats.sample
    weights = [w.detach().float() for w in weights]
    w_max = _column_max(weights)
    refs = [x @ w.t() for w in weights]
    norms = [float(r.pow(2).sum()) for r in refs]

    def error(xq: torch.Tensor, s: torch.Tensor | None) -> float:
        total = 0.0
        for w, c, n, ref, norm in zip(weights, configs, names, refs, norms):
            wq = _fake_quant_weight(w if s is None else w * s, c, n)
            total += float((xq @ wq.t() - ref).pow(2).sum()) / max(norm, 1e-30)
        return total / len(weights)

    base = error(_fake_quant_act(x, observer.compute_qparams()), None)
    best = (base, None, None, None)
    for alpha in sq.alphas:
        s = _factors(stats.absmax, w_max, alpha)
        obs = _fresh_like(observer)
        obs.update(x / s)
        qp = obs.compute_qparams()
        e = error(_fake_quant_act(x / s, qp), s)
        if e < best[0]:
            best = (e, alpha, s, (obs, qp))
    err, alpha, s, chosen = best
    if s is None or err > base * (1.0 - sq.min_gain):
        return Smoothing(name, None, None, base, base, group.fold)
    obs, qp = chosen
    lo, hi = obs.chosen_range()
    return Smoothing(name, s.contiguous(), alpha, err, base, group.fold, qp, (float(lo), float(hi)))


def _fresh_like(observer: Observer) -> Observer:
    """A new observer of the same class and configuration (qmin/qmax as resolved), no data."""
    fresh = copy.deepcopy(observer)
    fresh.reset()
    return fresh


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


def smoothed_weight(weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """A Linear's weight [N, C] with column c multiplied by s_c (a new tensor)."""
    return (weight.detach().float() * s).to(weight.dtype)


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
