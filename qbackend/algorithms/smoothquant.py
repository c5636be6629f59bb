"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights of the Linears that
read them, chosen on calibration data.

For a float activation X [..., C] read by static Linears W_i [N_i, C] (a LayerNorm's output read by
a block's query, key and value projections, say), any per-channel factor s > 0 gives the same
product, X W^T = (X / s)(W s)^T. Dividing X's outlier channels by s makes X / s easier to
quantize per tensor; the weight columns grow instead, and weights are quantized per output
channel, which absorbs it better. s_c = max|X_c|^alpha / max_i max|W_i[:, c]|^(1 - alpha).

* calibration: `ChannelStats` beside the value's ordinary observer records per-channel absolute
  maxima and a uniform sample of rows;
* the search (`choose`, at convert): for no smoothing and for the alphas of the grid (every
  other one, then the best one's neighbours; all with SmoothQuantConfig.exhaustive), the
  Linears' output error on the sample, sum over the Linears of |Q(X/s) Q(W s)^T - X W^T|^2 /
  |X W^T|^2, where Q(X/s) uses qparams from the configured activation observer fed X / s (no
  smoothing: the value's own observer, over all calibration data) and Q(W s) quantizes the
  weights as the int8 layers do; the error is measured on a sample of each Linear's output
  channels (SmoothQuantConfig.sample_outputs), the factors computed from all of them. The best
  alpha wins if it beats no smoothing by `min_gain`
  (settings: config.SmoothQuantConfig).

Which values are smoothed and how the factors are folded into the graph (at no run-time cost) is
the lowering's smoothquant pass (qbackend.lowering.smoothquant).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..config import QuantConfig, SmoothQuantConfig
from ..nn.weights import quantize_weight
from ..observers import Observer, QParams
from .sampling import sampled_rows

_S_MIN, _S_MAX = 1e-5, 1e5  # smoothing factors are clamped to this range


class ChannelStats(nn.Module):
    """A graph node recording, for a value [..., C], each channel's largest |x| and a uniform sample
    of up to `sample_rows` rows (priority sampling: every row gets a key, the smallest keys are
    kept, so the sample is uniform over all rows seen whatever the batch sizes). A row's key is a
    hash of its bits (`row_keys`), not a draw from a generator, so the sample is a function of the
    set of rows seen: the same whatever the order or split of the batches, and samples kept apart
    merge exactly (`merge`). Rows with NaN or inf are skipped (the value's observer reports them)."""

    def __init__(self, name: str, sample_rows: int, seed: int = 0):
        super().__init__()
        self.name, self.sample_rows, self.seed = name, int(sample_rows), int(seed)
        self.absmax: torch.Tensor | None = None
        self.sample: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None
        self.rows_seen = 0

    def forward(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
            return
        rows = x.detach().reshape(-1, x.shape[-1]).float()
        if rows.shape[0] == 0:
            return
        absmax = rows.abs().amax(dim=0)  # finite exactly when every row is (amax keeps NaN and inf)
        if not bool(torch.isfinite(absmax).all()):
            rows = rows[torch.isfinite(rows).all(dim=1)]
            if rows.shape[0] == 0:
                return
            absmax = rows.abs().amax(dim=0)
        self._add(absmax, rows.shape[0], rows, row_keys(rows, self.seed))

    def merge(self, other: ChannelStats) -> ChannelStats:
        """Fold another recorder's statistics of the same value in (in place); returns self. The
        result is what one recorder would hold after seeing both recorders' rows."""
        if other.sample_rows != self.sample_rows or other.seed != self.seed:
            raise ValueError(f"cannot merge ChannelStats {other.name!r} (sample_rows {other.sample_rows}, seed "
                             f"{other.seed}) into {self.name!r} (sample_rows {self.sample_rows}, seed {self.seed})")
        if other.absmax is not None:
            self._add(other.absmax, other.rows_seen, other.sample, other.keys)
        return self

    def _add(self, absmax: torch.Tensor, count: int, rows: torch.Tensor, keys: torch.Tensor) -> None:
        if self.absmax is not None and absmax.shape != self.absmax.shape:
            raise ValueError(f"ChannelStats {self.name!r}: {absmax.shape[0]} channels, but "
                             f"{self.absmax.shape[0]} before")
        self.absmax = absmax.clone() if self.absmax is None else torch.maximum(self.absmax, absmax)
        self.rows_seen += int(count)
        if self.sample is not None:
            rows, keys = torch.cat([self.sample, rows]), torch.cat([self.keys, keys])
        if rows.shape[0] > self.sample_rows:
            keep = keys.topk(self.sample_rows, largest=False).indices
            rows, keys = rows[keep], keys[keep]
        order = keys.argsort(stable=True)  # rows in key order, however they arrived
        self.sample, self.keys = rows[order].contiguous(), keys[order].contiguous()

    def extra_repr(self) -> str:
        return f"{self.name}: rows seen {self.rows_seen}, sampled {0 if self.sample is None else len(self.sample)}"


_MULTIPLIERS: dict[tuple[int, int], torch.Tensor] = {}


def key_multipliers(columns: int, seed: int = 0) -> torch.Tensor:
    """The fixed odd multiplier of each column that row_keys uses (int64 [columns], from seed)."""
    mult = _MULTIPLIERS.get((columns, seed))
    if mult is None:
        g = torch.Generator().manual_seed(0x5EED + seed)
        mult = torch.randint(-(1 << 62), 1 << 62, (columns,), generator=g, dtype=torch.int64) * 2 + 1
        _MULTIPLIERS[(columns, seed)] = mult
    return mult


def row_keys(rows: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A 64-bit key per row of a float32 [R, C] tensor, a function of the row's bits alone: the sum
    over columns of the bits times a fixed odd multiplier per column (mod 2^64), then MurmurHash3's
    64-bit finalizer (torch.ops.qbackend.row_keys; reference: ops.reference.row_keys). Equal rows
    get equal keys (and are sampled together); different ones keys that look independent and
    uniform."""
    return torch.ops.qbackend.row_keys(rows, key_multipliers(rows.shape[1], seed))


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


def resolve(setting) -> SmoothQuantConfig | None:
    """QuantConfig.smoothquant -> the settings to use ("auto": the defaults), or None (off)."""
    return SmoothQuantConfig() if setting == "auto" else setting


def fake_quantize(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """x quantized with per-tensor qp (levels clamped to [qmin, qmax]) and dequantized, in float32:
    the activation error the searches measure."""
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
def choose(fold: str, stats: ChannelStats, observer: Observer, weights: list[torch.Tensor],
           configs: list[QuantConfig], names: list[str], sq: SmoothQuantConfig) -> Smoothing:
    """The search of the module docstring, for one value. `fold`: how the lowering would fold
    the factors ("layer_norm" or "quantize"); `observer` is the value's own (calibrated)
    observer; `weights` the float weights of the Linears reading it."""
    name = observer.name
    if stats.sample is None or stats.absmax is None:
        return Smoothing(name, None, None, float("nan"), float("nan"), fold)
    x = stats.sample
    weights = [w.detach().float() for w in weights]
    w_max = _column_max(weights)  # the factors see every output channel; the error a sample of them
    weights = [_sampled_rows(w, sq.sample_outputs) for w in weights]
    ref = x @ torch.cat(weights).t()  # every Linear's sampled outputs side by side
    widths = [w.shape[0] for w in weights]
    norms = torch.stack([part.pow(2).sum() for part in ref.split(widths, dim=1)]).double().clamp_min(1e-30)

    def error(xq: torch.Tensor, s: torch.Tensor | None) -> float:
        wq = torch.cat([_fake_quant_weight(w if s is None else w * s, c, n) for w, c, n in zip(weights, configs, names)])
        diff = torch.addmm(ref, xq, wq.t(), beta=-1)  # Q(X/s) Q(W s)^T - X W^T
        per_linear = torch.stack([part.pow(2).sum() for part in diff.split(widths, dim=1)]).double()
        return float((per_linear / norms).mean())

    def smoothed(alpha: float) -> tuple:
        s = _factors(stats.absmax, w_max, alpha)
        obs = _fresh_like(observer)
        obs.update(x / s)
        qp = obs.compute_qparams()
        return error(fake_quantize(x / s, qp), s), alpha, s, (obs, qp)

    base = error(fake_quantize(x, observer.compute_qparams()), None)
    tried = {i: smoothed(sq.alphas[i]) for i in _first_alphas(len(sq.alphas), sq.exhaustive)}
    near = min(tried, key=lambda i: tried[i][0])
    for i in (near - 1, near + 1):
        if 0 <= i < len(sq.alphas) and i not in tried:
            tried[i] = smoothed(sq.alphas[i])
    best = min([(base, None, None, None)] + [tried[i] for i in sorted(tried)], key=lambda t: t[0])
    err, alpha, s, chosen = best
    if s is None or err > base * (1.0 - sq.min_gain):
        return Smoothing(name, None, None, base, base, fold)
    obs, qp = chosen
    lo, hi = obs.chosen_range()
    return Smoothing(name, s.contiguous(), alpha, err, base, fold, qp, (float(lo), float(hi)))


def _first_alphas(count: int, exhaustive: bool) -> list[int]:
    """The grid indices the search tries first: all of them, or every other one and the last (the
    search then tries the best one's neighbours)."""
    if exhaustive or count <= 3:
        return list(range(count))
    return sorted(set(range(0, count, 2)) | {count - 1})


def _sampled_rows(w: torch.Tensor, count: int) -> torch.Tensor:
    """`count` of w's rows (output channels, `sampled_rows`), in their order; all of them when
    there are no more. Weights are quantized per row, so the sample's quantized rows are those of
    the whole weight."""
    rows = sampled_rows(w.shape[0], count)
    return w if rows is None else w[rows]


def _fresh_like(observer: Observer) -> Observer:
    """A new observer of the same class and configuration (qmin/qmax as resolved), no data: a
    shallow copy, reset (reset assigns new statistics, never changing the copied ones)."""
    fresh = copy.copy(observer)
    fresh.reset()
    return fresh


def smoothed_weight(weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """A Linear's weight [N, C] with column c multiplied by s_c (a new tensor)."""
    return (weight.detach().float() * s).to(weight.dtype)
