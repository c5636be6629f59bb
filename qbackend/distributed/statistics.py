"""The calibration statistics the distributed reduction knows, and how each is reduced: what a rank
sends (a small state, gathered by every rank), what is summed in place (large fp64 sums,
all-reduced) and how the states of all ranks, in rank order, become the statistics one process
would hold after seeing every rank's batches.

* Observer (every kind whose merge is exact: the min/max, per-channel, histogram, percentile, MSE
  and best-range observers, and the TailHistogram beside min/max ones): its state_dict, merged
  by `Observer.merge`. MovingAverageMinMaxObserver is refused: its state depends on the order of
  the batches, so no split of them reproduces one process.
* ChannelStats (SmoothQuant): channel maxima, rows seen and the sample's keys gathered; then each
  rank sends only its sampled rows that the merged sample keeps (`sent_rows`, a second gather);
  merged by `ChannelStats.merge` (the keys are hashes of the rows, so the merged sample is one
  process's).
* HessianStats (GPTQ, bias correction): rows and column sums gathered, summed in rank order; H's
  fp64 sum all-reduced as its packed lower triangle, one H at a time through one buffer (every
  rank holds H afterwards: convert reads it on every rank)."""
from __future__ import annotations

import copy

import torch

from ..algorithms.gptq import HessianStats
from ..algorithms.smoothquant import ChannelStats
from ..observers import MovingAverageMinMaxObserver, Observer

__all__ = ["describe", "refusal", "local_state", "state_has_data", "state_has_sample", "sent_rows", "summed_size",
           "pack", "apply"]


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
    """Why this statistic cannot be reduced exactly (None if it can), naming it by its own name
    (the layer's value, for an observer) or else by `name`."""
    if isinstance(holder, MovingAverageMinMaxObserver):
        return (f"{holder.name or name}: a MovingAverageMinMaxObserver's range depends on the order of the batches, so no "
                "split of them across ranks gives one process's; use MinMaxObserver or a histogram observer")
    return None


def local_state(holder) -> dict:
    """The small state this rank sends to every rank (a ChannelStats' sample keys, not its rows)."""
    kind = _kind(holder)
    if kind == "observer":
        return holder.state_dict()
    if kind == "channel_stats":
        if holder.absmax is None:
            return {"rows_seen": 0}
        return {"rows_seen": holder.rows_seen, "absmax": holder.absmax, "keys": holder.keys}
    h = holder.products
    return {"rows": holder.rows, "column_sum": holder.column_sum, "shape": None if h is None else list(h.shape)}


def state_has_data(state: dict) -> bool:
    """Whether a `local_state` holds any calibration data."""
    if "stats" in state:  # an observer's state_dict
        return state["stats"].get("count", 0) > 0
    return bool(state.get("rows_seen") or state.get("rows"))


def state_has_sample(state: dict) -> bool:
    """Whether a `local_state` is a ChannelStats' with sampled rows (their keys)."""
    return "keys" in state


def _winners(states: list[dict], sample_rows: int) -> list[torch.Tensor]:
    """Per rank, the positions (increasing) of its sampled rows that are among the `sample_rows`
    smallest keys of all ranks: the rows of the merged sample."""
    keys = [s["keys"] if s["rows_seen"] else torch.empty(0, dtype=torch.int64) for s in states]
    allkeys = torch.cat(keys)
    keep = allkeys.topk(min(sample_rows, allkeys.numel()), largest=False).indices.sort().values
    out, start = [], 0
    for k in keys:
        mine = keep[(keep >= start) & (keep < start + k.numel())] - start
        out.append(mine)
        start += k.numel()
    return out


def sent_rows(holder, states: list[dict], rank: int) -> torch.Tensor | None:
    """The rows this rank sends in the second gather: its ChannelStats sample's rows that the
    merged sample keeps (so each rank receives about one sample's worth, not one per rank);
    None for other statistics."""
    if _kind(holder) != "channel_stats" or not states[rank]["rows_seen"]:
        return None
    return holder.sample[_winners(states, holder.sample_rows)[rank]]


_TRIANGLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _triangle(shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat positions in a contiguous [K, K] (or [G, K, K]) tensor of the lower triangle (diagonal
    included), row by row, and of the same entries mirrored into the upper triangle."""
    got = _TRIANGLES.get(shape)
    if got is None:
        k = shape[-1]
        rows, cols = torch.tril_indices(k, k)
        groups = torch.arange(shape[0] if len(shape) == 3 else 1, dtype=torch.int64)[:, None] * (k * k)
        got = _TRIANGLES[shape] = ((groups + rows * k + cols).reshape(-1), (groups + cols * k + rows).reshape(-1))
    return got


def summed_size(holder, states: list[dict]) -> int:
    """How many fp64 values this statistic adds into the all-reduce (0: none): H's lower
    triangle, diagonal included (H is symmetric)."""
    if _kind(holder) != "hessian":
        return 0
    shapes = {tuple(s["shape"]) for s in states if s["shape"] is not None}
    if not shapes:
        return 0
    if len(shapes) > 1:
        raise ValueError(f"{holder.name}: the ranks' H have different shapes {sorted(shapes)}")
    return _triangle(shapes.pop())[0].numel()


def pack(holder, states: list[dict], out: torch.Tensor) -> None:
    """This rank's addend to the all-reduce into `out` (summed_size values): H's lower triangle,
    row by row; zeros where this rank saw no rows but another rank did."""
    if holder.products is None:
        out.zero_()
        return
    lower, _ = _triangle(tuple(holder.products.shape))
    torch.index_select(holder.products.reshape(-1), 0, lower, out=out)  # the block triangle holds it all


def apply(holder, states: list[dict], total: torch.Tensor | None, rows: list) -> None:
    """Replace the holder's statistics by the merge of every rank's, in rank order: `states` every
    rank's local_state, `total` the all-reduced `pack` (None where summed_size is 0), `rows` every
    rank's `sent_rows`."""
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
        winners = _winners(states, holder.sample_rows)
        for state, sent, picked in zip(states, rows, winners):
            if state["rows_seen"]:
                if sent is None or sent.shape[0] != picked.numel():
                    raise ValueError(f"{holder.name}: a rank sent {None if sent is None else sent.shape[0]} sample "
                                     f"rows, {picked.numel()} expected")
                part = ChannelStats(holder.name, holder.sample_rows, holder.seed)
                part.rows_seen, part.absmax, part.sample, part.keys = (state["rows_seen"], state["absmax"], sent,
                                                                       state["keys"][picked])
                merged.merge(part)
        holder.absmax, holder.sample, holder.keys, holder.rows_seen = (merged.absmax, merged.sample, merged.keys,
                                                                       merged.rows_seen)
        return
    count, column_sum = 0, None
    for state in states:
        if state["rows"]:
            count += state["rows"]
            column_sum = state["column_sum"] if column_sum is None else column_sum + state["column_sum"]
    h = None
    if total is not None:
        shape = next(tuple(s["shape"]) for s in states if s["shape"] is not None)
        h = holder.products if holder.products is not None else torch.empty(shape, dtype=torch.float64)
        lower, upper = _triangle(shape)
        flat = h.view(-1)
        flat.index_copy_(0, lower, total)
        flat.index_copy_(0, upper, total)
    holder.set_sums(count, column_sum, h)
