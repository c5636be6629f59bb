"""Shared timing helper for the benchmarks: warm-up, then blocks of repeated calls, interleaved
round-robin over the candidates so that machine noise (a shared, 2-core box) hits all of them alike.

    res = measure({"a": lambda: f(x), "b": lambda: g(x)}, blocks=15, block_s=0.005)
    res["a"].min_us, res["a"].median_us

Each candidate gets its own repetition count (so one block of it lasts about `block_s`), fixed
after the warm-up. Short blocks (a few ms, about one scheduler time slice) give the minimum a
chance to catch a block that was not preempted when other processes compete for the cores. A
block's time is its wall time divided by its repetitions; the result keeps the minimum (the
least disturbed block: use it for ratios) and the median over blocks, and also the process CPU
time of each block (with one thread: the time actually spent running). The order of the
candidates rotates from block to block so none is always first after another's cache footprint.
Each block starts with one untimed call (unless a call is long against the block), so every
candidate is timed with its own data warm in cache, not cold after another candidate's weights.
The garbage collector is paused while timing.
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["Timing", "measure", "fmt_us"]


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]      # wall time per call of each block, us
    cpu_samples: tuple[float, ...]  # process CPU time per call of each block, us (all threads)
    reps: int                       # calls per block

    @property
    def min_us(self) -> float:
        return min(self.samples)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples)

    @property
    def cpu_min_us(self) -> float:
        """Least process CPU time per call: with one thread, the cost without the time this
        process spent descheduled (a check on wall times taken on a busy machine)."""
        return min(self.cpu_samples)

    @property
    def blocks(self) -> int:
        return len(self.samples)

    def merged(self, other: "Timing") -> "Timing":
        """Both measurements' blocks as one (e.g. a confirmation run of a suspicious row)."""
        return Timing(self.samples + other.samples, self.cpu_samples + other.cpu_samples, self.reps)

    def __str__(self) -> str:
        return f"{fmt_us(self.min_us)} / {fmt_us(self.median_us)}"


def fmt_us(us: float) -> str:
    """Microseconds with about three significant digits."""
    if us != us:  # NaN
        return "n/a"
    if us >= 100:
        return f"{us:.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def _estimate_call_s(fn: Callable[[], object], warmup_s: float, min_calls: int) -> float:
    """Warm fn up (at least `min_calls` calls and about `warmup_s` seconds); returns the fastest
    single call seen after the first, as the basis for the repetition count."""
    clock = time.perf_counter
    best = float("inf")
    start = clock()
    calls = 0
    while True:
        t0 = clock()
        fn()
        t1 = clock()
        calls += 1
        if calls > 1:
            best = min(best, t1 - t0)
        if calls >= min_calls and t1 - start >= warmup_s:
            break
        if calls >= min_calls and calls >= 10_000:
            break
    return best if best != float("inf") else t1 - t0


def measure(candidates: Mapping[str, Callable[[], object]], *, blocks: int = 15, block_s: float = 0.005,
            warmup_s: float = 0.05, min_warmup: int = 3, max_reps: int = 100_000, budget_s: float = 4.0,
            min_blocks: int = 5) -> dict[str, Timing]:
    """Times each zero-argument callable; returns {name: Timing} in microseconds per call.

    A candidate that has spent `budget_s` in timed blocks stops after `min_blocks` blocks (for
    very slow calls, e.g. 0.5 s each, rather than spending minutes on one row)."""
    names = list(candidates)
    reps: dict[str, int] = {}
    warm: dict[str, bool] = {}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for name in names:
            per_call = _estimate_call_s(candidates[name], warmup_s, min_warmup)
            reps[name] = max(1, min(max_reps, int(block_s / max(per_call, 1e-9))))
            warm[name] = per_call < 2 * block_s
        samples: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        spent: dict[str, float] = {n: 0.0 for n in names}
        clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
        for b in range(blocks):
            k = b % len(names)
            for name in names[k:] + names[:k]:
                fn, r = candidates[name], reps[name]
                if len(samples[name]) >= min_blocks and spent[name] >= budget_s:
                    continue
                if warm[name]:
                    fn()  # untimed: bring this candidate's weights back into cache after the others'
                c0 = cpu_clock()
                t0 = clock()
                for _ in range(r):
                    fn()
                t1 = clock()
                c1 = cpu_clock()
                samples[name].append((t1 - t0) / r / 1e3)
                spent[name] += (t1 - t0) / 1e9
                cpu[name].append((c1 - c0) / r / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {n: Timing(tuple(samples[n]), tuple(cpu[n]), reps[n]) for n in names}
