"""The calibration statistics the distributed reduction knows, and how each is reduced: what a rank
sends (a small state, gathered by every rank), what is summed in place (large fp64 sums,
all-reduced) and how the states of all ranks, in rank order, become the statistics one process
would hold after seeing every rank's batches.

* Observer (every kind whose merge is exact: the min/max, per-channel, histogram, percentile, MSE
  and best-range observers, and the TailHistogram beside min/max ones): its state_dict, merged
  by `Observer.merge`. MovingAverageMinMaxObserver is refused: its state depends on the order of
  the batches, so no split of them reproduces one process.
* ChannelStats (SmoothQuant): channel maxima, rows seen, the keyed sample; merged by
  `ChannelStats.merge` (the keys are hashes of the rows, so the merged sample is one process's).
* HessianStats (GPTQ, bias correction): rows and column sums gathered, summed in rank order; H's
  fp64 sum all-reduced (every rank holds it afterwards: convert reads it on every rank)."""
from __future__ import annotations

import copy

import torch

from ..algorithms.gptq import HessianStats
from ..algorithms.smoothquant import ChannelStats
from ..observers import MovingAverageMinMaxObserver, Observer

__all__ = ["describe", "refusal", "local_state", "summed", "apply", "has_data"]


def _kind(holder) -> str:
    if isinstance(holder, Observer):
        return "observer"
    if isinstance(holder, ChannelStats):
        return "channel_stats"
    if isinstance(holder, HessianStats):
        return "hessian"
    raise TypeError(f"{type(holder).__name__} is not a calibration statistic the reduction knows")


def describe(holder) -> dict:
    """What must agree across ranks (the statistic's type and settings), as plain values."""
    kind = _kind(holder)
    if kind == "observer":
        return {"kind": holder.kind, "config": holder.config()}
    if kind == "channel_stats":
        return {"kind": "ChannelStats", "sample_rows": holder.sample_rows, "seed": holder.seed}
    return {"kind": "HessianStats", "conv": None if holder.conv is None else sorted(map(list, holder.conv.items())),
            "second_moment": holder.second_moment}


def refusal(name: str, holder) -> str | None:
    """Why this statistic cannot be reduced exactly (None if it can)."""
    if isinstance(holder, MovingAverageMinMaxObserver):
        return (f"{name}: a MovingAverageMinMaxObserver's range depends on the order of the batches, so no "
                "split of them across ranks gives one process's; use MinMaxObserver or a histogram observer")
    return None


def has_data(holder) -> bool:
    kind = _kind(holder)
    if kind == "observer":
        return holder.has_data
    if kind == "channel_stats":
        return holder.absmax is not None
    return holder.rows > 0


def local_state(holder) -> dict:
    """The small state this rank sends to every rank."""
    kind = _kind(holder)
    if kind == "observer":
        return holder.state_dict()
    if kind == "channel_stats":
        if holder.absmax is None:
            return {"rows_seen": 0}
        return {"rows_seen": holder.rows_seen, "absmax": holder.absmax, "sample": holder.sample, "keys": holder.keys}
    h = holder.products
    return {"rows": holder.rows, "column_sum": holder.column_sum, "shape": None if h is None else list(h.shape)}


def summed(holder, states: list[dict]) -> torch.Tensor | None:
    """The fp64 tensor this rank adds into the all-reduce for the statistic (zeros where it saw no
    rows but another rank did), or None where nothing is summed."""
    if _kind(holder) != "hessian":
        return None
    shapes = {tuple(s["shape"]) for s in states if s["shape"] is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"{holder.name}: the ranks' H have different shapes {sorted(shapes)}")
    if holder.products is None:
        return torch.zeros(shapes.pop(), dtype=torch.float64)
    holder.hessian  # noqa: B018  (mirrors the block triangle into the upper half of the fp64 sum)
    return holder.products


def apply(holder, states: list[dict], total: torch.Tensor | None) -> None:
    """Replace the holder's statistics by the merge of every rank's, in rank order."""
    kind = _kind(holder)
    if kind == "observer":
        parts = []
        for state in states:
            part = copy.copy(holder)  # the same class and settings (a TailHistogram has no kind of its own)
            part.reset()
            parts.append(part.load_state_dict(state))
        holder.reset()
        for part in parts:
            holder.merge(part)
        return
    if kind == "channel_stats":
        merged = ChannelStats(holder.name, holder.sample_rows, holder.seed)
        for state in states:
            if state["rows_seen"]:
                part = ChannelStats(holder.name, holder.sample_rows, holder.seed)
                part.rows_seen, part.absmax, part.sample, part.keys = (state["rows_seen"], state["absmax"],
                                                                       state["sample"], state["keys"])
                merged.merge(part)
        holder.absmax, holder.sample, holder.keys, holder.rows_seen = (merged.absmax, merged.sample, merged.keys,
                                                                       merged.rows_seen)
        return
    rows, column_sum = 0, None
    for state in states:
        if state["rows"]:
            rows += state["rows"]
            column_sum = state["column_sum"] if column_sum is None else column_sum + state["column_sum"]
    holder.set_sums(rows, column_sum, total)
