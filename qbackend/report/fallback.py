"""The accuracy-budgeted fallback: `qbackend.quantize(..., eval_fn=..., max_drop=...)`.

If the INT8 model's metric drops more than `max_drop` below FP32's, the layers are ranked by
sensitivity (qbackend.compare on the calibration data: lowest own-layer SQNR first) and the most
sensitive are kept in FP32, in that order, until the metric is within the budget. The search
doubles the number of FP32 layers (1, 2, 4, ...) until the budget is met, then bisects down to
the fewest that meet it, so it converts O(log n) models, not n. It always returns a model: the
one within budget with the fewest FP32 layers, else (with a BudgetWarning) the best metric
found. `qmodel.qbackend_fallback` reports the layers kept in FP32, the metrics, every step, and
the latency of the FP32 and returned models on the example inputs.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch import nn

from .compare import compare


class BudgetWarning(UserWarning):
    """The accuracy budget could not be met; the best model found is returned."""


@dataclass
class FallbackReport:
    """What the accuracy-budgeted fallback did: the layers kept in FP32, the metrics, each step."""

    kept_fp32: list[str]
    fp32_metric: float
    int8_metric: float
    max_drop: float
    met: bool
    steps: list[dict] = field(default_factory=list)
    latency_ms: dict = field(default_factory=dict)

    def to_markdown(self) -> str:
        lines = [f"FP32 metric {self.fp32_metric:.4f}, INT8 {self.int8_metric:.4f} (budget: drop <= {self.max_drop}): "
                 + ("met" if self.met else "NOT met, best model returned"),
                 f"kept in FP32 ({len(self.kept_fp32)}): {', '.join(self.kept_fp32) or 'none'}"]
        if self.latency_ms:
            lines.append("latency (example inputs): " + ", ".join(f"{k} {v:.2f} ms" for k, v in self.latency_ms.items()))
        lines += ["", "| FP32 layers | metric | drop |", "|---|---|---|"]
        lines += [f"| {s['kept']} | {s['metric']:.4f} | {s['drop']:.4f} |" for s in self.steps]
        return "\n".join(lines)


def _latencies_ms(models: dict[str, nn.Module], args: tuple, kwargs: dict, rounds: int = 15) -> dict[str, float]:
    """Median latency of each model, the models interleaved round by round (a shared machine's
    load then hits them alike); a rough figure, not a benchmark."""
    times = {k: [] for k in models}
    with torch.no_grad():
        for m in models.values():
            m(*args, **kwargs)
        for _ in range(rounds):
            for k, m in models.items():
                t0 = time.perf_counter()
                m(*args, **kwargs)
                times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def quantize_within_budget(model: nn.Module, example_inputs: tuple, calibration: list, config,
                           quantize_fn: Callable, eval_fn: Callable, max_drop: float,
                           example_kwargs: dict | None = None):
    """quantize_fn(config) -> a converted model. Returns the chosen model with .qbackend_fallback."""
    if not callable(eval_fn):
        raise TypeError("eval_fn must be a function model -> float (higher is better)")
    max_drop = float(max_drop)
    if not max_drop >= 0:
        raise ValueError(f"max_drop must be >= 0, got {max_drop}")
    base = float(eval_fn(model))
    first = quantize_fn(config)
    steps = [{"kept": 0, "metric": float(eval_fn(first)), "layers": []}]
    steps[0]["drop"] = base - steps[0]["metric"]
    best, best_step = first, steps[0]
    if steps[0]["drop"] > max_drop:
        ranked = [r.name for r in compare(model, first, calibration).ranked()]
        # config names are module paths: the k-th call of a reused module is the module itself
        order = list(dict.fromkeys(name.split("@")[0] for name in ranked))
        results: dict[int, tuple] = {}

        def attempt(k: int):
            if k not in results:
                keep = order[:k]
                cfg = replace(config, by_name={**config.by_name, **{n: None for n in keep}})
                q = quantize_fn(cfg)
                metric = float(eval_fn(q))
                step = {"kept": k, "metric": metric, "drop": base - metric, "layers": keep}
                steps.append(step)
                results[k] = (q, step)
            return results[k]

        k, lo = 1, 0
        met_k = None
        while True:
            k = min(k, len(order))
            q, step = attempt(k)
            if step["drop"] <= max_drop:
                met_k = k
                break
            lo = k
            if k == len(order):
                break
            k *= 2
        if met_k is not None:
            hi = met_k
            while hi - lo > 1:  # the fewest FP32 layers that meet the budget, assuming rough monotonicity
                mid = (lo + hi) // 2
                if attempt(mid)[1]["drop"] <= max_drop:
                    hi = mid
                else:
                    lo = mid
            best, best_step = results[hi]
        else:
            best, best_step = max(results.values(), key=lambda qs: qs[1]["metric"])
            best_step = best_step if best_step["metric"] > steps[0]["metric"] else steps[0]
            if best_step is steps[0]:
                best = first
    met = best_step["drop"] <= max_drop
    report = FallbackReport(kept_fp32=list(best_step["layers"]), fp32_metric=base, int8_metric=best_step["metric"],
                            max_drop=max_drop, met=met, steps=sorted(steps, key=lambda s: s["kept"]))
    args, kwargs = example_inputs, dict(example_kwargs or {})
    report.latency_ms = _latencies_ms({"fp32": model, "returned": best}, args, kwargs)
    if not met:
        warnings.warn(f"qbackend: the accuracy budget (drop <= {max_drop}) could not be met; returning the best model "
                      f"found (drop {best_step['drop']:.4f} with {len(best_step['layers'])} layers in FP32)",
                      BudgetWarning, stacklevel=3)
    best.qbackend_fallback = report
    return best
