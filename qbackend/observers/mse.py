"""MSE observer: the range whose actual round trip (quantize, dequantize) has the least squared
error over the calibration data, searched over candidate ranges on the exactly mergeable
power-of-two histogram of histogram.py (so it merges exactly, too).

Candidates: the observed range including 0, [lo, hi] = [min(min, 0), max(max, 0)] (symmetric:
[-a, a] with a = max(-lo, hi)), shrunk towards 0 by `candidates` factors 1, 1 - 1/n, ..., 1/n
(default n = 100). Each candidate's qparams come from qparams.choose_qparams (float32 scale,
integer zero point, so the rounding of the real qparams is part of the objective), and its error
is the exact L2 error of that quantizer (levels (q - zero_point) * scale, clamped at qmin/qmax)
over the histogram's mass, spread uniformly within each bin clipped to [min, max]: C++
torch.ops.qbackend.histogram_quant_error, O(bins x candidates). The least error wins; ties go to
the wider range. Factor 1 is the min/max range, so the choice is never worse than min/max by
this objective.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import _is_int, _ops
from .histogram import DEFAULT_BINS, _PowerOfTwoHistogram
from .qparams import choose_qparams

__all__ = ["MSEObserver"]


class MSEObserver(_PowerOfTwoHistogram):
    """Per-tensor range minimising the histogram-weighted round-trip MSE over shrunk candidates."""

    kind = "MSEObserver"

    def __init__(self, dtype: torch.dtype = torch.uint8, symmetric: bool = False, *, candidates: int = 100,
                 bins: int = DEFAULT_BINS, **kwargs):
        if not _is_int(candidates):
            raise TypeError(f"candidates must be an int, got {type(candidates).__name__}")
        if not 1 <= candidates <= 10000:
            raise ValueError(f"candidates must be in [1, 10000], got {candidates}")
        self.candidates = candidates
        super().__init__(dtype, symmetric, bins=bins, **kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {**super()._extra_config(), "candidates": self.candidates}

    def candidate_errors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lo, hi, error) of every candidate, float64 tensors, widest first."""
        if not self.has_data:
            raise self._no_data_error()
        n = self.candidates
        factors = torch.arange(n, 0, -1, dtype=torch.float64) / n
        lo, hi = min(self.min_val, 0.0), max(self.max_val, 0.0)
        if self.symmetric:
            a = max(-lo, hi)
            los, his = -a * factors, a * factors
        else:
            los, his = lo * factors, hi * factors
        qp = choose_qparams(los, his, self.dtype, self.symmetric, self.qmin, self.qmax, reduce_range=False,
                            eps=self.eps, axis=0)
        scale = qp.scale.double()
        c0 = (self.qmin - qp.zero_point.double()) * scale
        err = _ops().histogram_quant_error(*self._hist_args(), c0, scale, self.qmax - self.qmin + 1)
        return los, his, err

    def _range(self) -> tuple[float, float]:
        los, his, err = self.candidate_errors()
        i = int(torch.argmin(err))  # first minimum: the widest of equals
        return float(los[i]), float(his[i])
