"""Histogram observers: an exactly mergeable histogram of the calibration data, and the range
choices made over it (L2 search here; percentile.py and mse.py add two more).

The histogram. Bins have width 2^k (k an integer) and sit on multiples of the width: bin j of the
window counts the finite values x with floor(x * 2^-k) == offset + j, j < `bins`. Its geometry is
a function of the data's global finite min and max only:

    k      = the smallest integer with  floor(max * 2^-k) - floor(min * 2^-k) <= bins - 1
             (and k >= e - 35 where 2^e > max(|min|, |max|), so bin numbers stay below 2^36 and
             constant data still has a finite k; k >= -183 for all-zero data),
    offset = floor(min * 2^-k).

When new data does not fit, k grows: adjacent bins are summed, which is exact because the bins of
width 2^(k+1) are unions of bins of width 2^k. So the histogram (k, offset, counts) and min/max
depend only on the multiset of values seen, not on batch order or how the data was split, and
`merge` (coarsen both to the common k, align the offsets, add) gives exactly the one-pass state.
floor(x * 2^-k) is exact in float64 (a power-of-two scaling of a float32).

The hot loops are C++ (csrc/ops/observer_ops.cpp): `histogram_pow2` bins a tensor into the
current window in one pass that also yields its finite min/max, non-finite count and the count of
values outside the window (when the range grew past the window, that batch is binned again at the
new k: rare after the first batches, as the window has up to bins/2 bins of headroom), and
`histogram_search_l2` chooses the range.

`HistogramObserver` chooses the range that minimises the L2 quantization error over the histogram,
as torch.ao's HistogramObserver does: a greedy shrink from both ends in quantile steps of 1e-5 of
the mass, stopping when the error grows; each bin's mass is spread uniformly over the bin clipped
to [min, max], and a candidate [lo, hi] is quantized to qmax - qmin + 1 levels (torch.ao uses 256
whatever the range). The search lands on bin edges (or min/max). Two differences from torch.ao,
both deliberate: the arithmetic is exact (int64 counts, float64 quantiles and errors; torch.ao
compares float32 cumulative sums, which round once the data exceeds 2^24 values), and the first
shrink must beat the error of the full range [min, max] (torch.ao takes it unconditionally, which
can leave it far worse than min/max, e.g. on uniform data plus one far outlier).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .base import Observer, _is_int, _ops, check_min_max
from .qparams import QParams

__all__ = ["HistogramObserver", "required_log2_width", "DEFAULT_BINS"]

DEFAULT_BINS = 2048
MIN_BINS, MAX_BINS = 16, 1 << 20
_INDEX_BITS = 35  # bin numbers stay below 2^(_INDEX_BITS + 1)
_K_MIN = -148 - _INDEX_BITS  # float32's smallest subnormal is 2^-149 < 2^-148


def _bin(v: float, k: int) -> int:
    """floor(v * 2^-k), exactly."""
    return math.floor(math.ldexp(v, -k))


def _k_floor(amax: float) -> int:
    if amax == 0.0:
        return _K_MIN
    return max(math.frexp(amax)[1] - _INDEX_BITS, _K_MIN)


def _fits(lo: float, hi: float, k: int, bins: int) -> bool:
    return _bin(hi, k) - _bin(lo, k) <= bins - 1


def required_log2_width(lo: float, hi: float, bins: int) -> int:
    """The canonical k for finite data in [lo, hi] (see the module docstring); monotone: a wider
    range never needs a smaller k."""
    k_floor = _k_floor(max(abs(lo), abs(hi)))
    if _fits(lo, hi, k_floor, bins):
        return k_floor
    k = max(k_floor, math.frexp(hi - lo)[1] - (bins - 1).bit_length() - 1)
    while not _fits(lo, hi, k, bins):
        k += 1
    while k > k_floor and _fits(lo, hi, k - 1, bins):
        k -= 1
    return k


def _coarsen(counts: torch.Tensor, k: int, offset: int, k2: int, offset2: int) -> torch.Tensor:
    """Counts of the window (k, offset) re-binned into the window (k2 >= k, offset2), exactly."""
    if k2 == k and offset2 == offset:
        return counts
    nz = counts.nonzero().flatten()
    out = torch.zeros_like(counts)
    if nz.numel():
        shift = min(k2 - k, 62)  # bin numbers are below 2^36: a larger shift gives the same floor
        idx = torch.div(nz + offset, 2 ** shift, rounding_mode="floor") - offset2
        if int(idx.min()) < 0 or int(idx.max()) >= counts.numel():  # pragma: no cover - internal invariant
            raise AssertionError(f"re-binning from (k={k}, offset={offset}) to (k={k2}, offset={offset2}) "
                                 "leaves the window")
        out.index_add_(0, idx, counts[nz])
    return out


def _check_inside(outside: torch.Tensor) -> None:
    if int(outside) != 0:  # pragma: no cover - internal invariant: the window was made to fit
        raise AssertionError(f"{int(outside)} finite values fell outside a window made to fit them")


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


class _PowerOfTwoHistogram(Observer):
    """The histogram statistics shared by the histogram-based observers."""

    def __init__(self, dtype: torch.dtype = torch.uint8, symmetric: bool = False, *, bins: int = DEFAULT_BINS,
                 **kwargs):
        if not _is_int(bins):
            raise TypeError(f"bins must be an int, got {type(bins).__name__}")
        if not MIN_BINS <= bins <= MAX_BINS:
            raise ValueError(f"bins must be in [{MIN_BINS}, {MAX_BINS}], got {bins}")
        self.bins = bins
        super().__init__(dtype, symmetric, **kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {"bins": self.bins}

    def _reset_stats(self) -> None:
        self.log2_width: int | None = None
        self.offset: int | None = None
        self.counts = torch.zeros(self.bins, dtype=torch.int64)
        self.min_val: float | None = None
        self.max_val: float | None = None

    def _observe(self, x: torch.Tensor) -> None:
        ops = _ops()
        if self.count == 0:
            mn, mx, nf = ops.finite_minmax(x)
            nf = int(nf)
            self._skip_nonfinite(nf)
            if nf == x.numel():
                return
            lo, hi = float(mn), float(mx)
            k = required_log2_width(lo, hi, self.bins)
            off = _bin(lo, k)
            counts, *_, outside = ops.histogram_pow2(x, k, off, self.bins)
            _check_inside(outside)
        else:
            c, mn, mx, nf, outside = ops.histogram_pow2(x, self.log2_width, self.offset, self.bins)
            nf = int(nf)
            self._skip_nonfinite(nf)
            if nf == x.numel():
                return
            lo, hi = min(self.min_val, float(mn)), max(self.max_val, float(mx))
            k = required_log2_width(lo, hi, self.bins)
            off = _bin(lo, k)
            if int(outside) == 0:  # everything fell in the window: coarsening is exact
                counts = _coarsen(self.counts + c, self.log2_width, self.offset, k, off)
            else:  # the range outgrew the window: bin this batch again at the new k
                c, *_, outside = ops.histogram_pow2(x, k, off, self.bins)
                _check_inside(outside)
                counts = _coarsen(self.counts, self.log2_width, self.offset, k, off) + c
        self.log2_width, self.offset, self.counts = k, off, counts
        self.min_val, self.max_val = lo, hi
        self.count += x.numel() - nf

    def _stats(self) -> dict[str, Any]:
        return {"min_val": self.min_val, "max_val": self.max_val, "log2_width": self.log2_width,
                "offset": self.offset, "counts": self.counts}

    def _load_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        lo, hi = check_min_max(stats)
        counts, k, off = stats["counts"], stats["log2_width"], stats["offset"]
        if not (isinstance(counts, torch.Tensor) and counts.dtype == torch.int64 and counts.shape == (self.bins,)
                and counts.device.type == "cpu"):
            raise ValueError(f"state_dict stats['counts'] must be a CPU int64 tensor of shape ({self.bins},), got "
                             f"{(counts.dtype, tuple(counts.shape)) if isinstance(counts, torch.Tensor) else counts!r}")
        if (counts < 0).any():
            raise ValueError("state_dict stats['counts'] must be non-negative")
        if int(counts.sum()) != stats["count"]:
            raise ValueError(f"state_dict stats['counts'] sum to {int(counts.sum())}, but count is {stats['count']}")
        if stats["count"] == 0:
            if k is not None or off is not None:
                raise ValueError("state_dict stats log2_width/offset must be None when count is 0")
        else:
            if _f32(lo) != lo or _f32(hi) != hi:
                raise ValueError("state_dict stats min_val/max_val must be float32 values")
            want_k = required_log2_width(lo, hi, self.bins)
            if k != want_k or off != _bin(lo, want_k) or not _is_int(off):
                raise ValueError(f"state_dict stats log2_width/offset ({k!r}, {off!r}) are not the canonical "
                                 f"({want_k}, {_bin(lo, want_k)}) for [min, max] = [{lo}, {hi}]")
            last = _bin(hi, k) - off
            nz = counts.nonzero().flatten()
            if int(nz[0]) != 0 or int(nz[-1]) != last:
                raise ValueError(f"state_dict stats['counts'] must have mass exactly in bins 0 to {last} "
                                 f"(the bins of min and max), got bins {int(nz[0])} to {int(nz[-1])}")
        return {"min_val": lo, "max_val": hi, "log2_width": k, "offset": off, "counts": counts}

    def _merge_stats(self, other: _PowerOfTwoHistogram) -> None:
        lo, hi = min(self.min_val, other.min_val), max(self.max_val, other.max_val)
        k = required_log2_width(lo, hi, self.bins)
        off = _bin(lo, k)
        self.counts = (_coarsen(self.counts, self.log2_width, self.offset, k, off)
                       + _coarsen(other.counts, other.log2_width, other.offset, k, off))
        self.log2_width, self.offset, self.min_val, self.max_val = k, off, lo, hi

    # ------------------------------------------------------------------ helpers

    def bin_edges(self) -> torch.Tensor:
        """The bins+1 edges (offset + j) * 2^k of the window, float64 (exact)."""
        if not self.has_data:
            raise self._no_data_error()
        j = torch.arange(self.offset, self.offset + self.bins + 1, dtype=torch.float64)
        return j * math.ldexp(1.0, self.log2_width)

    def bin_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per bin, the interval its mass is spread over in the error models: the bin clipped to
        [min, max] (float64 lower and upper bounds)."""
        e = self.bin_edges()
        return e[:-1].clamp(self.min_val, self.max_val), e[1:].clamp(self.min_val, self.max_val)

    def value_at(self, fraction: float) -> float:
        """The value below which `fraction` (in [0, 1]) of the mass lies, interpolated linearly in
        its bin (mass uniform over the bin clipped to [min, max])."""
        if not self.has_data:
            raise self._no_data_error()
        counts = self.counts.double()
        cum = counts.cumsum(0)
        target = min(max(fraction, 0.0), 1.0) * float(cum[-1])
        j = int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64))[0])
        j = min(j, self.bins - 1)
        lower, upper = self.bin_bounds()
        before = float(cum[j - 1]) if j > 0 else 0.0
        frac = (target - before) / float(counts[j]) if counts[j] > 0 else 0.0
        lo, hi = float(lower[j]), float(upper[j])
        return min(max(lo + frac * (hi - lo), self.min_val), self.max_val)

    def _hist_args(self) -> tuple:
        return self.counts, self.log2_width, self.offset, self.min_val, self.max_val

    def quantization_error(self, qparams: QParams) -> float:
        """L2 error of quantizing the histogram's mass (uniform within each bin clipped to [min, max])
        with per-tensor qparams: the objective of the searches, for comparing ranges."""
        if qparams.per_channel:
            raise ValueError("quantization_error needs per-tensor qparams")
        if not self.has_data:
            raise self._no_data_error()
        c0 = torch.tensor([(qparams.qmin - qparams.zero_point) * qparams.scale], dtype=torch.float64)
        step = torch.tensor([float(qparams.scale)], dtype=torch.float64)
        return float(_ops().histogram_quant_error(*self._hist_args(), c0, step, qparams.qmax - qparams.qmin + 1)[0])


class HistogramObserver(_PowerOfTwoHistogram):
    """Per-tensor histogram with the L2-minimising range search (see the module docstring).

    Activations by default: uint8 asymmetric, `bins` = 2048 power-of-two bins at most.
    """

    kind = "HistogramObserver"

    def _range(self) -> tuple[float, float]:
        lo, hi = _ops().histogram_search_l2(*self._hist_args(), self.qmax - self.qmin + 1).tolist()
        return lo, hi
