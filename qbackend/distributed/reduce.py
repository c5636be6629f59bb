"""The reduction of calibration statistics across the ranks of a process group (`reduce_statistics`),
in the order the ranks check and exchange:

1. roll call: every rank is there (collectives.roll_call; a dead or late rank is named);
2. identity: the digests of each rank's model, weights, configuration and statistics are gathered
   and compared with rank 0's, so a rank that prepared something else is named before any
   statistic moves;
3. refusals: statistics that cannot be reduced exactly (statistics.refusal) stop every rank alike;
4. states: each rank's small states (observers, SmoothQuant's channel maxima and sample keys, the
   Hessian recorders' row counts and column sums) to every rank (wire.py, no pickle); then the
   sampled rows the merged samples keep, each from the rank holding it;
5. sums: the Hessians' fp64 sums all-reduced, each as its packed lower triangle, one at a time
   through one buffer;
6. every rank merges the states in rank order, so all ranks hold the same bits, equal to what
   one process would hold after calibrating on all ranks' batches.

Memory per rank: its own statistics, plus every rank's small states during step 4 (8 bytes per
sampled row's key per rank), the merged samples' rows (sample_rows x C x 4 bytes per smoothed
value, whatever the number of ranks) and one buffer the size of the largest H's lower triangle."""
from __future__ import annotations

import datetime
import json
import time
import warnings
from dataclasses import dataclass, field

import torch

from . import statistics as stats
from .collectives import DistributedCalibrationError, all_gather_bytes, all_reduce_sum, check_group, roll_call
from .fingerprint import text_digest
from .wire import decode, encode

__all__ = ["reduce_statistics", "ReductionReport", "DEFAULT_TIMEOUT", "RankWithoutDataWarning", "PartialReductionError"]

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch.distributed's default for gloo groups
_IDENTITY_LABELS = {"structure": "model (graph and parameter shapes)", "weights": "weights",
                    "config": "configuration", "statistics": "calibration statistics (names and settings)"}


class PartialReductionError(DistributedCalibrationError):
    """The reduction failed after it began to change the statistics: they are partly reduced, and
    converting them would give a wrong model."""


class RankWithoutDataWarning(UserWarning):
    """A rank calibrated on no data: the reduced statistics are the other ranks'."""


@dataclass
class ReductionReport:
    """What one rank's reduction did: the group's size, the statistics reduced, the ranks that
    had seen no calibration data; the bytes this rank received in the gathers (padding included;
    `bytes_sampled_rows` of them in the gather of SmoothQuant's sampled rows, about one sample per
    smoothed value whatever the number of ranks); the bytes of the fp64 sums all-reduced (a ring
    all-reduce sends and receives about twice that per rank); and the seconds spent (in all,
    waiting at the roll call, gathering, summing the Hessians)."""

    ranks: int
    statistics: int
    ranks_without_data: list[int] = field(default_factory=list)
    bytes_gathered: int = 0
    bytes_sampled_rows: int = 0
    bytes_summed: int = 0
    seconds: float = 0.0
    seconds_roll_call: float = 0.0
    seconds_gather: float = 0.0
    seconds_sum: float = 0.0


def _identity_error(rank: int, digests: list[dict]) -> str | None:
    wrong = []
    for r, d in enumerate(digests):
        parts = [_IDENTITY_LABELS.get(k, k) for k in sorted(set(d) | set(digests[0])) if d.get(k) != digests[0].get(k)]
        if parts:
            wrong.append(f"rank {r}'s {', '.join(parts)}")
    if not wrong:
        return None
    return (f"rank {rank}: the ranks did not prepare the same model: {'; '.join(wrong)} differ from rank 0's; "
            "every rank must call prepare on the same model, weights and config before calibrating")


def reduce_statistics(statistics: list[tuple[str, object]], identity: dict[str, bytes], group=None,
                      timeout: datetime.timedelta | None = None) -> ReductionReport:
    """Reduce `statistics` ((name, recorder) in the model's order, the same on every rank) across
    `group` (None: the default group; gloo). `identity`: digests that must agree across ranks
    (fingerprint.py). Every rank ends holding the same statistics. Raises
    DistributedCalibrationError (a rank failed, timed out, or prepared something else) or
    ValueError (a statistic that cannot be reduced exactly)."""
    rank, world = check_group(group)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    report = ReductionReport(ranks=world, statistics=len(statistics))
    start = time.perf_counter()
    roll_call(group, timeout)
    report.seconds_roll_call = time.perf_counter() - start

    described = json.dumps([[name, stats.describe(h)] for name, h in statistics], sort_keys=True, default=str)
    mine = {**{k: v.hex() for k, v in identity.items()}, "statistics": text_digest(described).hex()}
    t = time.perf_counter()
    digests = [decode(b) for b in all_gather_bytes(encode(mine), group, timeout, "identity check")]
    error = _identity_error(rank, digests)
    if error is not None:
        raise DistributedCalibrationError(error)
    refusals = [why for why in (stats.refusal(name, h) for name, h in statistics) if why is not None]
    if refusals:
        raise ValueError("these calibration statistics cannot be reduced across ranks exactly: " + "; ".join(refusals))

    gathered = all_gather_bytes(encode([stats.local_state(h) for _, h in statistics]), group, timeout,
                                "gather of the statistics")
    report.bytes_gathered = world * max(g.numel() for g in gathered)
    states = [decode(g) for g in gathered]
    for r, s in enumerate(states):
        if not isinstance(s, list) or len(s) != len(statistics) or not all(isinstance(st, dict) for st in s):
            raise DistributedCalibrationError(f"rank {rank}: rank {r}'s statistics are malformed (expected "
                                              f"{len(statistics)} states)")
    report.ranks_without_data = [r for r in range(world) if not any(stats.state_has_data(s) for s in states[r])]
    if report.ranks_without_data and len(report.ranks_without_data) < world:
        warnings.warn(f"rank(s) {', '.join(map(str, report.ranks_without_data))} calibrated on no data; the reduced "
                      "statistics are those of the other ranks", RankWithoutDataWarning, stacklevel=3)

    per_stat = [[states[r][i] for r in range(world)] for i in range(len(statistics))]
    sent = [stats.sent_rows(h, per_stat[i], rank) for i, (_, h) in enumerate(statistics)]
    rows = [None] * len(statistics)
    if any(stats.state_has_sample(st) for s in states for st in s):  # the same decision on every rank
        gathered = all_gather_bytes(encode(sent), group, timeout, "gather of the sampled rows")
        report.bytes_sampled_rows = world * max(g.numel() for g in gathered)  # what the padded gather moved
        report.bytes_gathered += report.bytes_sampled_rows
        by_rank = [decode(g) for g in gathered]
        rows = [[by_rank[r][i] for r in range(world)] for i in range(len(statistics))]
    report.seconds_gather = time.perf_counter() - t

    t = time.perf_counter()
    sizes = [stats.summed_size(h, per_stat[i]) for i, (_, h) in enumerate(statistics)]
    report.bytes_summed = 8 * sum(sizes)
    buffer = torch.empty(max(sizes, default=0), dtype=torch.float64)  # one H at a time: no copy of them all
    try:  # from here on the statistics change: a failure leaves them partly reduced
        for i, (_, h) in enumerate(statistics):
            if sizes[i]:
                part = buffer[:sizes[i]]
                stats.pack(h, per_stat[i], part)
                all_reduce_sum(part, group, timeout, "sum of the Hessians")
                stats.apply(h, per_stat[i], part, _rows(rows[i], world))
        report.seconds_sum = time.perf_counter() - t
        for i, (_, h) in enumerate(statistics):
            if not sizes[i]:
                stats.apply(h, per_stat[i], None, _rows(rows[i], world))
    except (RuntimeError, ValueError, TypeError) as exc:
        error = PartialReductionError(f"rank {rank}: the reduction failed after it began to replace this rank's "
                                      f"statistics, which are now partly reduced ({exc}); prepare and calibrate "
                                      "again")
        raise error from exc
    report.seconds = time.perf_counter() - start
    return report


def _rows(rows, world: int) -> list:
    return rows if rows is not None else [None] * world

