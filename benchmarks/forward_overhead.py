"""Whole-forward overhead of the converted zoo CNNs: the eager forward with its forward plan
(qbackend/nn/forward_plan.py: one native call), the same forward running the graph op by op, and
the sum of the plan's op times, per model at batch 1 (and the batches given).

    python benchmarks/forward_overhead.py [--models digits_cnn,resnet18,resnet50,mobilenet_v2]
                                          [--batches 1,32] [--threads 2] [--out FILE]

Forward times: benchmarks/_timing.py's interleaved blocks (plan, graph), minimum and median.
Op times: torch.profiler over 50 replays of the plan, the total time of each op the plan calls (its
top-level events: the kernels and the aten ops between them), summed per forward. "overhead / op" =
(plan forward - op sum) / ops, what the plan costs beyond its ops; it includes the model's Python
entry (input checks, the signature lookup, the output's pytree), shared by all of its ops. The
profiler adds its own cost inside each op's time, so the op sum is if anything high and the
overhead low by about as much (a few hundred ns per op).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from _timing import measure  # noqa: E402

import qbackend  # noqa: E402
from qbackend.models import MODELS  # noqa: E402


def _op_sum_us(q, x, iters: int = 50) -> tuple[float, int]:
    """(us of the plan's ops per forward, ops per forward) from the profiler's top-level events."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            q(*x)
    top = [e for e in prof.events() if e.cpu_parent is None and not e.name.startswith("ProfilerStep")]
    return sum(e.cpu_time_total for e in top) / iters, len(top) // iters


def row(name: str, batch: int) -> str:
    case = MODELS[name](batch_size=max(batch, 8), num_calibration_batches=4, num_eval_batches=1)
    q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
    first = case.calibration[0]
    x = tuple(torch.cat([t] * ((batch + 7) // 8))[:batch] for t in first)

    def plan():
        q.forward_plans = True
        q(*x)

    def graph():
        q.forward_plans = False
        q(*x)

    with torch.no_grad():
        plan(), plan(), plan()
        summary = q.forward_plan_summary()
        res = measure({"plan": plan, "graph": graph}, blocks=15, block_s=0.02)
        q.forward_plans = True
        ops_us, ops = _op_sum_us(q, x)
    p, g = res["plan"], res["graph"]
    over = (p.min_us - ops_us) / max(ops, 1)
    print(f"{name} b{batch}: {summary}", file=sys.stderr, flush=True)
    return (f"| {name} | {batch} | {p.min_us:.1f} / {p.median_us:.1f} | {g.min_us:.1f} / {g.median_us:.1f} | "
            f"{g.min_us / p.min_us:.2f}x | {ops} | {ops_us:.1f} | {over:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits_cnn,resnet18,resnet50,mobilenet_v2")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    rows = [row(name, int(b)) for name in args.models.split(",") for b in args.batches.split(",")]
    report = "\n".join([
        "# Whole-forward overhead: forward plans against the graph op by op", "", *run_lines([args.threads]),
        "- method: benchmarks/forward_overhead.py's docstring; us per forward, min / median over interleaved "
        "blocks; thread pools at their defaults (OMP_WAIT_POLICY unset)", "",
        "| model | batch | plan forward | graph forward | graph / plan | ops | op sum (profiler) | overhead / op |",
        "|---|---|---|---|---|---|---|---|", *rows, ""])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
