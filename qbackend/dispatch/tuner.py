"""Tune mode: pick a layer's provider by timing each candidate on the layer's real shapes, instead
of by the rule table, and remember the choice on disk (tune_cache.py) so that converting the
same model again does no timing.

    key = TuneKey.make("linear", {"m": 64, "k": 768, "n": 768}, post_op="relu", out="uint8")
    result, from_cache = tune(key, {"fbgemm": build_fbgemm, "onednn": build_onednn}, TuneCache())
    result.provider, result.why()     # "onednn", "tuned: onednn 412 us, fbgemm 530 us (1.29x)"

`builders[p]()` returns a zero-argument callable that runs the layer once with provider p on a
representative input. Timing (`time_candidates`) is interleaved: each round runs every candidate
in turn, so drift on a shared machine (frequency, other processes) hits all candidates alike.
`tune` takes the minimum over 15 short rounds (TUNE_TIMING): a kernel's time is deterministic
and other processes only ever add to it, so the least disturbed round is the best estimate (the
median of multi-thread calls on a busy 2-core machine measured scheduler quanta).

`tune_route` is tune mode for one layer, as the router (routing.py) runs it: `tune` at each batch
size of the request, the provider with the best geometric mean of its time relative to the fastest
winning, the rule table's provider kept when it is within TUNE_MARGIN of it.

This module re-exports the cache's names, so `from qbackend.dispatch.tuner import ...` is enough.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from ..ops import registry
from .tune_cache import (TuneCache, TuneCacheWarning, TuneKey, TuneResult, default_cache_path, machine_fingerprint)

__all__ = ["TuneKey", "TuneResult", "TuneCache", "TuneCacheWarning", "TuneOptions", "TuneRequest",
           "default_cache_path", "machine_fingerprint", "time_candidates", "tune", "tune_route"]

# Tune mode keeps the rule table's provider unless another one is faster by more than this: the
# rules are measured on many layers, one layer's timing on a busy machine is noisier than a few
# per cent, and a near-tie costs nothing either way.
TUNE_MARGIN = 1.03


@dataclass(frozen=True)
class TuneOptions:
    """Tune mode as the user asks for it (qbackend.convert(tune=True, ...)).

    batch_sizes: the batch sizes to time (None: the example's); cache: a TuneCache (None: the
    default on-disk cache)."""

    batch_sizes: tuple[int, ...] | None = None
    cache: TuneCache | None = None


@dataclass(frozen=True)
class TuneRequest:
    """Tune mode for one layer: the options, what identifies the layer's kernel in the cache
    (`key_op`, the rules' shape at each batch size `shape_at(b)`, and the `variant`: output dtype,
    post-op, activation bits...), the example's batch size, and `bench(provider, b)`, which
    builds the layer on that provider and returns a zero-argument callable running it once at
    batch size b (it may raise ValueError or RuntimeError: that provider is no candidate)."""

    options: TuneOptions
    key_op: str
    batch: int
    shape_at: Callable[[int], Mapping]
    variant: Mapping
    bench: Callable[[str, int], Callable[[], object]]

MAX_CALLS_PER_ROUND = 1_000_000
# How tune() times candidates unless told otherwise.
TUNE_TIMING = {"warmup": 2, "rounds": 15, "min_round_s": 0.001, "statistic": "min"}
_STATISTICS = {"median": statistics.median, "min": min}


def _calls_per_round(fn: Callable[[], object], min_round_s: float, clock: Callable[[], float]) -> int:
    """How many back-to-back calls of fn last at least min_round_s (measured, growing n)."""
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        elapsed = clock() - t0
        if elapsed >= min_round_s or n >= MAX_CALLS_PER_ROUND:
            return n
        if elapsed <= 0:
            grown = n * 10
        else:  # aim 20% past the target, at least doubling, at most 100x per step
            grown = max(2 * n, min(100 * n, math.ceil(n * min_round_s / elapsed * 1.2)))
        n = min(MAX_CALLS_PER_ROUND, grown)


def time_candidates(fns: Mapping[str, Callable[[], object]], *, warmup: int = 2, rounds: int = 7,
                    min_round_s: float = 0.002, clock: Callable[[], float] = time.perf_counter,
                    statistic: str = "median") -> dict[str, float]:
    """The time per call, in microseconds, of each zero-argument callable in `fns`: the median
    (or, statistic="min", the minimum) over rounds.

    1. warmup: `warmup` calls of each candidate, round-robin (a, b, a, b, ...);
    2. calibration, per candidate: the number of calls n_p that lasts >= min_round_s (starting
       at 1 call and growing; a candidate slower than min_round_s gets n_p = 1);
    3. `rounds` rounds; round r runs each candidate's n_p calls back to back, the candidates in
       their order rotated by r (round 0: a, b, c; round 1: b, c, a; ...), so no candidate always
       runs right after the same one. A round's sample is its elapsed clock time / n_p.

    The result is the median (or min) of each candidate's `rounds` samples, x 1e6. `clock` returns seconds
    (time.perf_counter by default; tests inject a fake one). Exceptions from a candidate propagate.
    """
    names = list(fns)
    if not names:
        raise ValueError("time_candidates needs at least one candidate")
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(_STATISTICS)}, got {statistic!r}")
    if warmup < 0 or rounds < 1 or not min_round_s >= 0:
        raise ValueError(f"need warmup >= 0, rounds >= 1, min_round_s >= 0 "
                         f"(got {warmup}, {rounds}, {min_round_s})")
    for _ in range(warmup):
        for name in names:
            fns[name]()
    calls = {name: _calls_per_round(fns[name], min_round_s, clock) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            fn, n = fns[name], calls[name]
            t0 = clock()
            for _ in range(n):
                fn()
            samples[name].append((clock() - t0) / n)
    reduce = _STATISTICS[statistic]
    return {name: reduce(samples[name]) * 1e6 for name in names}


def tune(key: TuneKey, builders: Mapping[str, Callable[[], Callable[[], object]]], cache: TuneCache | None = None,
         **timing) -> tuple[TuneResult, bool]:
    """(the fastest provider for `key` among `builders`, whether it came from the cache).

    With a cache, a stored result whose provider is among `builders` is returned as is: nothing
    is built or timed. Otherwise each builder is called; a builder that raises ValueError or
    RuntimeError, or whose runnable raises one on its first call, is not a candidate (a provider
    that refuses the geometry or the CPU). The remaining candidates are timed with
    `time_candidates(**{**TUNE_TIMING, **timing})` (rounded to 0.001 us); the fastest wins (ties: the first in `builders` order).
    The result is stored in the cache (if any). `cache=None` means no caching at all, not the
    default cache: pass `TuneCache()` for that. Raises ValueError if no provider can run, or if
    `builders` names a provider qbackend does not know.
    """
    unknown = sorted(set(builders) - registry.all_names())
    if unknown:
        raise ValueError(f"tune {key}: unknown provider(s) {', '.join(map(repr, unknown))}; "
                         f"expected among {', '.join(sorted(registry.all_names()))}")
    if cache is not None:
        hit = cache.get(key)
        if hit is not None and hit.provider in builders:
            return hit, True
    runnables: dict[str, Callable[[], object]] = {}
    refused: dict[str, str] = {}
    for provider, build in builders.items():
        try:
            fn = build()
            fn()  # one call: a runnable that fails here is no candidate (and the call warms it up)
        except (ValueError, RuntimeError) as exc:
            refused[provider] = f"{type(exc).__name__}: {exc}"
            continue
        runnables[provider] = fn
    if not runnables:
        detail = "; ".join(f"{p}: {why}" for p, why in refused.items()) or "no builders given"
        raise ValueError(f"tune {key}: no provider can run it ({detail})")
    # to the ns, as stored; a call is never faster than that (the cache holds positive times only)
    times = {p: max(round(t, 3), 0.001) for p, t in time_candidates(runnables, **{**TUNE_TIMING, **timing}).items()}
    best = min(runnables, key=lambda p: times[p])
    result = TuneResult(best, times)
    if cache is not None:
        cache.put(key, result)
    return result, False


def tune_route(request: TuneRequest, candidates, rule_provider: str | None = None) -> tuple[str, str]:
    """(provider, why) from timing `candidates` (or the cache) at each batch size of the request;
    the rule's provider is kept when it is within TUNE_MARGIN of the fastest."""
    cache = request.options.cache if request.options.cache is not None else TuneCache()
    batches = request.options.batch_sizes or (request.batch,)
    results = []
    for b in batches:
        key = TuneKey.make(request.key_op, request.shape_at(int(b)), **request.variant)
        builders = {p: (lambda p=p, b=int(b): request.bench(p, b)) for p in candidates}
        res, hit = tune(key, builders, cache)
        results.append((b, res, hit))
    scores = {}
    for p in candidates:
        ratios = [r.times_us[p] / min(r.times_us.values()) for _, r, _ in results if p in r.times_us]
        if len(ratios) == len(results):
            scores[p] = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    if not scores:
        raise ValueError("no provider could run it")
    best = min(scores, key=scores.get)
    detail = "; ".join(f"batch {b}: {r.why().removeprefix('tuned: ')}" + (" (cached)" if hit else "")
                       for b, r, hit in results)
    if rule_provider in scores and rule_provider != best and scores[rule_provider] <= scores[best] * TUNE_MARGIN:
        return rule_provider, f"tuned: {detail}; kept the rule's {rule_provider} (within {TUNE_MARGIN:.2f}x)"
    return best, f"tuned: {detail}"
