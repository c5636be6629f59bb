"""Percentile observer: the range between two percentiles of the calibration data's mass, read off
the exactly mergeable power-of-two histogram of histogram.py (so it merges exactly, too).

lo is the (100 - p)-th and hi the p-th percentile (p = `percentile`, default 99.99): the value at
which the histogram's cumulative mass reaches that fraction, interpolated linearly within the bin
(mass uniform over the bin clipped to [min, max]). p = 100 gives [min, max]. Symmetric qparams
use max(|lo|, |hi|). The interpolation is exact to within one bin of the data's percentile.
"""
from __future__ import annotations

from typing import Any

import torch

from .histogram import DEFAULT_BINS, _PowerOfTwoHistogram

__all__ = ["PercentileObserver"]


class PercentileObserver(_PowerOfTwoHistogram):
    """Per-tensor range [P(100 - p), P(p)] of the data (activations: uint8 asymmetric by default)."""

    kind = "PercentileObserver"

    def __init__(self, dtype: torch.dtype = torch.uint8, symmetric: bool = False, *, percentile: float = 99.99,
                 bins: int = DEFAULT_BINS, **kwargs):
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 50.0 < percentile <= 100.0:
            raise ValueError(f"percentile must be in (50, 100], got {percentile!r}")
        self.percentile = float(percentile)
        super().__init__(dtype, symmetric, bins=bins, **kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {**super()._extra_config(), "percentile": self.percentile}

    def _range(self) -> tuple[float, float]:
        q = self.percentile / 100.0
        return self.value_at(1.0 - q), self.value_at(q)
