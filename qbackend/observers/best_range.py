"""Best-range observer: of the ranges the histogram searches find, the one whose quantizer has the
least L2 error over the calibration data.

The greedy L2 shrink of HistogramObserver (torch.ao's search) stops at the first step that does
not lower its error, which is often a local minimum; the proportional grid of MSEObserver tries
every shrink factor of the min/max range, but only ranges that shrink both ends together. Each
wins on some values (on ResNet-50's activations the grid finds the lower error for most of them;
the whole flow's SQNR per observer: benchmarks/results/epyc_zen4/accuracy_sources.md, section 2).
This observer computes both on the same exactly mergeable power-of-two histogram and keeps the
range whose actual qparams (qparams.choose_qparams: float32 scale, integer zero point) have the
least error by the same objective, torch.ops.qbackend.histogram_quant_error; a tie goes to the
greedy search's range. The grid includes min/max, so the choice is never worse than min/max, the
greedy search or the grid alone by that objective. It merges exactly, as its histogram does.
"""
from __future__ import annotations

from .base import _ops
from .mse import MSEObserver
from .qparams import choose_qparams

__all__ = ["BestRangeObserver"]


class BestRangeObserver(MSEObserver):
    """Per-tensor range: the lower-L2 of HistogramObserver's search and MSEObserver's grid (see the
    module docstring); activations by default (uint8 asymmetric)."""

    kind = "BestRangeObserver"

    def candidate_ranges(self) -> list[tuple[float, float, float]]:
        """(lo, hi, L2 error of its qparams) for the greedy search's range and the grid's best."""
        greedy = tuple(_ops().histogram_search_l2(*self._hist_args(), self.qmax - self.qmin + 1).tolist())
        grid = super()._range()
        out = []
        for lo, hi in (greedy, grid):
            qp = choose_qparams(lo, hi, self.dtype, self.symmetric, self.qmin, self.qmax, reduce_range=False,
                                eps=self.eps)
            out.append((float(lo), float(hi), self.quantization_error(qp)))
        return out

    def _range(self) -> tuple[float, float]:
        (glo, ghi, gerr), (mlo, mhi, merr) = self.candidate_ranges()
        return (mlo, mhi) if merr < gerr else (glo, ghi)
