"""`qbackend.report.plan_profile.profile_plan(qmodel, *inputs)`: where a forward plan's time goes.

A converted model's eager forward replays a recorded plan (nn/forward_plan.py) in one native call.
`profile_plan` replays it with a steady-clock read between steps, so each step's wall time (its
dispatcher call, argument checks, output allocation, kernel, thread fork and join) comes with no
profiler inside it, then times the model's whole Python calls back to back. Each step is
attributed to the layer whose module ran it (by the recorder's module tracking), so a table can set
a layer's step time beside its arithmetic. What the forward costs beyond its steps is taken within
single calls, so that load from other processes (which moves a whole forward by more than this
cost) cancels: the Python entry (each whole call less the replay inside it, which the native plan
times) plus the replay loop (each timed replay less its steps).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..nn.model import QuantizedModel


@dataclass
class StepTime:
    """One plan step: its op, the module that ran it (None: the graph itself), the quantized layer
    that module is (None for ops between layers), and its wall time in us over the replays."""

    op: str
    module: str | None
    layer: str | None
    min_us: float
    median_us: float
    mean_us: float


@dataclass
class PlanProfile:
    """A plan's steps in order, and per replay: the sum of the steps, the native replay call and the
    model's whole Python call, each (min, median, mean) in us over `repeats` calls. A whole call's
    Python entry runs with its caches cold after the replay's kernels (benchmarks/results/epyc_zen5/
    layer_profile_*.md), so it grows with the model: about 2 us on the digits CNN, tens on ResNets."""

    steps: list[StepTime]
    steps_sum_us: tuple[float, float, float]
    replay_us: tuple[float, float, float]
    forward_us: tuple[float, float, float]
    loop_us: tuple[float, float, float]   # per timed replay: the replay less its steps (the loop's own cost)
    entry_us: tuple[float, float, float]  # per whole call: the call less its own replay (the Python entry)

    @property
    def overhead_us(self) -> tuple[float, float, float]:
        """What a forward costs beyond its steps: the Python entry plus the replay loop, each taken
        within one call, so other load on the machine moves it little (min, median, mean)."""
        return tuple(e + lp for e, lp in zip(self.entry_us, self.loop_us))

    def overhead_per_step_us(self, stat: int = 1) -> float:
        """overhead_us / steps, from the minima (stat 0), medians (1) or means (2)."""
        return self.overhead_us[stat] / max(len(self.steps), 1)


def _stats(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), statistics.fmean(values)


def profile_plan(qmodel: QuantizedModel, *args, repeats: int = 200, **kwargs) -> PlanProfile:
    """Profile the forward plan of `qmodel(*args, **kwargs)`: records it first where needed (two
    calls), then runs `repeats` timed replays and `repeats` timed whole calls back to back."""
    if not isinstance(qmodel, QuantizedModel):
        raise TypeError(f"qmodel must be a model from qbackend.convert / quantize / load, got {type(qmodel).__name__}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    with torch.no_grad():
        plan, tensors = qmodel.recorded_plan(*args, **kwargs)
        for _ in range(2):
            if plan is not None:
                break
            qmodel(*args, **kwargs)
            plan, tensors = qmodel.recorded_plan(*args, **kwargs)
        if plan is None:
            raise ValueError("these inputs run no forward plan: " + "; ".join(qmodel.forward_plan_summary()))
        per_step = [[] for _ in plan.step_names]
        sums, replays, forwards, loops, entries = [], [], [], [], []
        for _ in range(repeats):
            out, ns = plan.run_timed(tensors)
            if out is None:
                raise ValueError("a step's output sizes differ from the recording: the plan stopped")
            for i, v in enumerate(ns[:-1]):
                per_step[i].append(v / 1e3)
            sums.append(sum(ns[:-1]) / 1e3)
            replays.append(ns[-1] / 1e3)
            loops.append(replays[-1] - sums[-1])
        for _ in range(repeats):  # back to back, as a user's loop of forwards runs
            t0 = time.perf_counter_ns()
            qmodel(*args, **kwargs)
            forwards.append((time.perf_counter_ns() - t0) / 1e3)
            entries.append(forwards[-1] - plan.native.last_replay_ns / 1e3)
    steps = [StepTime(op, module, layer, *_stats(times)) for op, module, layer, times in
             zip(plan.step_names, plan.step_modules, plan.step_layers(qmodel.layer_by_module()), per_step)]
    return PlanProfile(steps, _stats(sums), _stats(replays), _stats(forwards), _stats(loops), _stats(entries))
