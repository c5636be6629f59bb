"""Min/max observers: the range of the data as it is (no clipping of outliers).

* `MinMaxObserver`: the running min and max of every finite value seen. Merging is exact: the
  merged min/max are those of all the data, in any split and order.
* `MovingAverageMinMaxObserver`: min and max of each batch, averaged over batches with constant c
  (the first batch sets them; then  m <- m + c * (batch_m - m),  in float64). Its merge is only an
  approximation, as no pair of running averages determines the average over the interleaved
  batches: merge takes the envelope of the two running ranges, min(min_a, min_b) and
  max(max_a, max_b) (never narrower than either side, so no calibration data of either side is
  clipped more than it was), and adds the batch counts.
* `PerChannelMinMaxObserver`: min/max per slice along `axis`; for weights (default: int8,
  symmetric, axis 0, i.e. per output channel). Merging is exact.

The one-pass statistics (finite min/max and the non-finite count) come from the C++ op
torch.ops.qbackend.finite_minmax.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .base import Observer, ObserverError, _is_int, _ops, check_min_max

__all__ = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver"]


def _batch_minmax(obs: Observer, x: torch.Tensor) -> tuple[float, float, int] | None:
    """(min, max, #finite) of x after the non-finite policy; None when x has no finite value."""
    mn, mx, nf = _ops().finite_minmax(x)
    nf = int(nf)
    obs._skip_nonfinite(nf)
    finite = x.numel() - nf
    return (float(mn), float(mx), finite) if finite else None


class MinMaxObserver(Observer):
    """Per-tensor min/max of the calibration data (activations: uint8 asymmetric by default)."""

    kind = "MinMaxObserver"

    def _reset_stats(self) -> None:
        self.min_val: float | None = None
        self.max_val: float | None = None

    def _observe(self, x: torch.Tensor) -> None:
        r = _batch_minmax(self, x)
        if r is None:
            return
        mn, mx, finite = r
        if self.count == 0:
            self.min_val, self.max_val = mn, mx
        else:
            self.min_val, self.max_val = min(self.min_val, mn), max(self.max_val, mx)
        self.count += finite

    def _stats(self) -> dict[str, Any]:
        return {"min_val": self.min_val, "max_val": self.max_val}

    def _load_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        lo, hi = check_min_max(stats)
        return {"min_val": lo, "max_val": hi}

    def _merge_stats(self, other: MinMaxObserver) -> None:
        self.min_val = min(self.min_val, other.min_val)
        self.max_val = max(self.max_val, other.max_val)

    def _range(self) -> tuple[float, float]:
        return self.min_val, self.max_val


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Batch min/max averaged over batches with `averaging_constant` c in (0, 1].

    merge (approximate, see the module docstring): the envelope of the two running ranges.
    """

    kind = "MovingAverageMinMaxObserver"

    def __init__(self, dtype: torch.dtype = torch.uint8, symmetric: bool = False, *,
                 averaging_constant: float = 0.01, **kwargs):
        if isinstance(averaging_constant, bool) or not isinstance(averaging_constant, (int, float)) or not (
                0.0 < averaging_constant <= 1.0):
            raise ValueError(f"averaging_constant must be in (0, 1], got {averaging_constant!r}")
        self.averaging_constant = float(averaging_constant)
        super().__init__(dtype, symmetric, **kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {"averaging_constant": self.averaging_constant}

    def _reset_stats(self) -> None:
        super()._reset_stats()
        self.batches = 0

    def _observe(self, x: torch.Tensor) -> None:
        r = _batch_minmax(self, x)
        if r is None:  # a batch without finite values does not move the averages
            return
        mn, mx, finite = r
        c = self.averaging_constant
        if self.count == 0:
            self.min_val, self.max_val = mn, mx
        else:
            self.min_val += c * (mn - self.min_val)
            self.max_val += c * (mx - self.max_val)
        self.batches += 1
        self.count += finite

    def _stats(self) -> dict[str, Any]:
        return {**super()._stats(), "batches": self.batches}

    def _load_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        out = super()._load_stats(stats)
        b = stats["batches"]
        if not _is_int(b) or b < 0 or (b == 0) != (stats["count"] == 0):
            raise ValueError(f"state_dict stats['batches'] must be an int >= 0, 0 exactly when count is 0, got {b!r}")
        return {**out, "batches": b}

    def _merge_stats(self, other: MovingAverageMinMaxObserver) -> None:
        super()._merge_stats(other)
        self.batches += other.batches


class PerChannelMinMaxObserver(Observer):
    """Min/max per slice along `axis` (weights: int8 symmetric per output channel by default).

    The number of channels is fixed by the first update; qparams are per-channel (1-D scale and
    zero-point tensors, QParams.axis = axis). A channel that saw no finite value makes
    compute_qparams raise ObserverError naming the channel.
    """

    kind = "PerChannelMinMaxObserver"
    _per_channel = True

    def __init__(self, dtype: torch.dtype = torch.int8, symmetric: bool = True, *, axis: int = 0, **kwargs):
        if not _is_int(axis):
            raise TypeError(f"axis must be an int, got {type(axis).__name__}")
        self.axis = axis
        super().__init__(dtype, symmetric, **kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {"axis": self.axis}

    def _reset_stats(self) -> None:
        self.min_val: torch.Tensor | None = None
        self.max_val: torch.Tensor | None = None

    @property
    def channels(self) -> int | None:
        return None if self.min_val is None else self.min_val.numel()

    def _observe(self, x: torch.Tensor) -> None:
        d = x.dim()
        if not (d >= 1 and -d <= self.axis < d):
            raise ValueError(f"{self._label()}: axis {self.axis} does not index an input with {d} dimension(s) "
                             f"(shape {tuple(x.shape)})")
        c = x.shape[self.axis]
        if self.channels is not None and c != self.channels:
            raise ValueError(f"{self._label()}: input has {c} channels along axis {self.axis}, the observer "
                             f"has {self.channels}")
        mn, mx, nf = _ops().finite_minmax(x, self.axis)
        n_nonfinite = int(nf.sum())
        self._skip_nonfinite(n_nonfinite)
        if n_nonfinite == x.numel():  # nothing finite: no change (min_val stays None until data)
            return
        if self.min_val is None:
            self.min_val, self.max_val = mn, mx
        else:
            self.min_val, self.max_val = torch.minimum(self.min_val, mn), torch.maximum(self.max_val, mx)
        self.count += x.numel() - n_nonfinite

    def _stats(self) -> dict[str, Any]:
        return {"min_val": self.min_val, "max_val": self.max_val}

    def _load_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        lo, hi = stats["min_val"], stats["max_val"]
        if lo is None and hi is None:
            if stats["count"] != 0:
                raise ValueError("state_dict stats min_val/max_val are None but count is not 0")
            return {"min_val": None, "max_val": None}
        for key, t in (("min_val", lo), ("max_val", hi)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 1 or t.numel() == 0:
                raise ValueError(f"state_dict stats[{key!r}] must be a non-empty 1-D float32 tensor or None, got "
                                 f"{t if not isinstance(t, torch.Tensor) else (t.dtype, tuple(t.shape))!r}")
        if lo.shape != hi.shape:
            raise ValueError(f"state_dict stats min_val and max_val differ in shape: {tuple(lo.shape)} vs "
                             f"{tuple(hi.shape)}")
        # a channel without finite data keeps (+inf, -inf); otherwise finite with min <= max
        empty = (lo == math.inf) & (hi == -math.inf)
        if not (torch.isfinite(lo) & torch.isfinite(hi) & (lo <= hi) | empty).all():
            raise ValueError("state_dict stats min_val/max_val must be finite with min <= max per channel "
                             "(or +inf/-inf for a channel without data)")
        if stats["count"] == 0 or (empty.all() and stats["count"] > 0):
            raise ValueError("state_dict stats count does not match min_val/max_val")
        return {"min_val": lo, "max_val": hi}

    def _merge_stats(self, other: PerChannelMinMaxObserver) -> None:
        if other.channels != self.channels:
            raise ValueError(f"cannot merge {other._label()} with {other.channels} channels into {self._label()} "
                             f"with {self.channels}")
        self.min_val = torch.minimum(self.min_val, other.min_val)
        self.max_val = torch.maximum(self.max_val, other.max_val)

    def _range(self) -> tuple[torch.Tensor, torch.Tensor]:
        empty = self.min_val > self.max_val
        if empty.any():
            idx = empty.nonzero().flatten().tolist()
            shown = ", ".join(map(str, idx[:10])) + (", ..." if len(idx) > 10 else "")
            raise ObserverError(f"{self._label()}: {len(idx)} channel(s) along axis {self.axis} saw no finite "
                                f"calibration value: {shown}")
        return self.min_val.clone(), self.max_val.clone()
