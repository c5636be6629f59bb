"""Calibration outliers: an activation range spent on a few extreme calibration values.

One value of 1000 among N(0, 1) calibration data makes a min/max range [-3, 1000]: 256 uint8
levels 3.9 apart, so the values that matter get about two levels, and the L2 (histogram) and MSE
searches keep such a range too, as clipping the one value costs more squared error on the
calibration data than the coarse levels do. `find_outlier_range` tells this apart from data that
is merely wide, from the observer's power-of-two histogram (histogram.py; observers without one,
the min/max family, get a `TailHistogram` beside them during calibration):

* the central range [P(TAIL), P(1 - TAIL)], TAIL = 1% of the mass on each side, and its width
  (both ranges include 0, as the qparams do; symmetric observers: twice the larger magnitude);
* a finding when the chosen range is at least RATIO = 10 times as wide as the central one:
  the central 98% of the values then get at most 1/10 of the levels (uint8: 25 of 256, under
  5 bits). Well-behaved data stays far below it: N(0, 1) has a max / P(99%) ratio of 1.6 at 1e4
  values and 2.4 at 1e8, Laplace data 3.5 at 1e6, so only tails that a handful of values make
  reach 10.

Each finding gives the share of values far outside the central range (beyond it by more than its
width), from which `suggested_percentile` picks a percentile observer setting that excludes them
(the PercentileObserver's range, `QuantConfig(activation=ObserverSpec("percentile", ...))`): right
for stray calibration values; a per-tensor histogram cannot tell them from outlier channels the
model always produces, for which the warning names SmoothQuant and FP32 as the remedies.
`warn_outliers` emits one CalibrationOutlierWarning naming every finding.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from .base import Observer
from .histogram import _PowerOfTwoHistogram

__all__ = ["CalibrationOutlierWarning", "OutlierFinding", "TailHistogram", "find_outlier_range",
           "needs_tail_histogram", "suggested_percentile", "warn_outliers"]

TAIL = 0.01
RATIO = 10.0
# The percentile observer settings suggested: the first whose per-side exclusion is more than the
# far values' share.
PERCENTILES = (99.99, 99.9, 99.5, 99.0, 98.0, 95.0, 90.0)


class CalibrationOutlierWarning(UserWarning):
    """An activation's chosen range is dominated by a few outlying calibration values."""


class TailHistogram(_PowerOfTwoHistogram):
    """The power-of-two histogram alone, kept beside an observer that has none (the min/max
    family) so that its range can be checked for outliers; silent about non-finite values (the
    observer it shadows warns)."""

    def _skip_nonfinite(self, n: int) -> None:
        self.nonfinite_count += n

    def _range(self) -> tuple[float, float]:
        return self.min_val, self.max_val


@dataclass(frozen=True)
class OutlierFinding:
    """A value whose chosen range is at least RATIO times its central range: the ranges, the
    number of values seen and the largest share of them far outside the central range on one
    side."""

    name: str
    chosen: tuple[float, float]
    central: tuple[float, float]
    count: int
    far_fraction: float
    ratio: float  # chosen width / central width


def _width(lo: float, hi: float, symmetric: bool) -> float:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    return 2.0 * max(-lo, hi) if symmetric else hi - lo


def needs_tail_histogram(observer: Observer) -> bool:
    """Whether the observer keeps no histogram of its own (a TailHistogram must shadow it)."""
    return not isinstance(observer, _PowerOfTwoHistogram) and not getattr(observer, "_per_channel", False)


def _histogram_of(observer: Observer, shadow: _PowerOfTwoHistogram | None) -> _PowerOfTwoHistogram | None:
    if isinstance(observer, _PowerOfTwoHistogram):
        return observer
    return shadow if shadow is not None and shadow.has_data else None


def find_outlier_range(observer: Observer, shadow: _PowerOfTwoHistogram | None = None,
                       chosen: tuple | None = None) -> OutlierFinding | None:
    """The finding for this observer's chosen range (`chosen`, where the caller has it; None: not
    dominated by outliers, or no histogram to tell: a per-channel observer, or no data)."""
    hist = _histogram_of(observer, shadow)
    if hist is None or not observer.has_data or getattr(observer, "_per_channel", False):
        return None
    chosen = tuple(float(v) for v in (observer.chosen_range() if chosen is None else chosen))
    central = (hist.value_at(TAIL), hist.value_at(1.0 - TAIL))
    central_width = _width(*central, observer.symmetric)
    if not central_width > 0.0 or not _width(*chosen, observer.symmetric) >= RATIO * central_width:
        return None
    lo, hi = central
    width = hi - lo if hi > lo else central_width
    lower, upper = hist.bin_bounds()
    counts = hist.counts.double()
    above = float(counts[lower > hi + width].sum())
    below = float(counts[upper < lo - width].sum())
    return OutlierFinding(observer.name or "(unnamed)", chosen, central, hist.count,
                          max(above, below) / max(hist.count, 1), _width(*chosen, observer.symmetric) / central_width)


def suggested_percentile(findings: list[OutlierFinding]) -> float:
    """The largest of PERCENTILES whose per-side exclusion, 100 - p percent, leaves out every
    finding's far values."""
    need = max((f.far_fraction for f in findings), default=0.0) * 100.0
    for p in PERCENTILES:
        if 100.0 - p > need:
            return p
    return PERCENTILES[-1]


def _fmt(r: tuple[float, float]) -> str:
    return f"[{r[0]:.4g}, {r[1]:.4g}]"


def warn_outliers(findings: list[OutlierFinding], stacklevel: int = 2) -> None:
    """One CalibrationOutlierWarning naming each finding (nothing when there is none)."""
    if not findings:
        return
    p = suggested_percentile(findings)
    rows = "; ".join(f"{f.name}: range {_fmt(f.chosen)} chosen, the central {100 - 2 * 100 * TAIL:g}% of its "
                     f"{f.count} values lie in {_fmt(f.central)} ({f.ratio:.0f}x narrower; "
                     f"{f.far_fraction * f.count:.0f} values far outside it)" for f in findings[:8])
    more = f"; and {len(findings) - 8} more" if len(findings) > 8 else ""
    warnings.warn(
        f"qbackend: {len(findings)} activation range{'s are' if len(findings) > 1 else ' is'} dominated by a few "
        f"outlying calibration values, which leaves the other values few int8 levels: {rows}{more}. Check the "
        "calibration data for outliers, or choose ranges by percentile: QuantConfig(activation=ObserverSpec("
        f"\"percentile\", {{\"dtype\": torch.uint8, \"percentile\": {p:g}}})) (config.activation; by_name / by_type "
        "for some layers only). Where the outliers are the model's own (the same channels in every batch), clipping "
        "loses them: smooth them into the next Linear's weights (QuantConfig(smoothquant=SmoothQuantConfig())) or "
        "keep that layer in FP32 (by_name={layer: None})", CalibrationOutlierWarning, stacklevel=stacklevel)
