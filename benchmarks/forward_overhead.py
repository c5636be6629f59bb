"""Whole-forward overhead of the converted zoo CNNs: the eager forward with its forward plan
(qbackend/nn/forward_plan.py: one native call), the same forward running the graph op by op, and
what a forward costs beyond the steps of its plan, per model at batch 1 (and the batches given).

    python benchmarks/forward_overhead.py [--models digits_cnn,resnet18,resnet50,mobilenet_v2]
                                          [--batches 1,32] [--threads 2] [--out FILE]

Forward times: benchmarks/_timing.py's interleaved blocks (plan, graph), minimum and median.
Steps and overhead: qbackend.report.plan_profile over 200 replays and 200 forwards: the sum of the
plan's step times (each step timed by the replay, no profiler inside), and the overhead taken within
single calls (a forward less the replay inside it, the Python entry; a replay less its steps, the
loop), at the median, per layer (the model's int8 conv / linear layers) and per step.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from _timing import measure  # noqa: E402

import qbackend  # noqa: E402
from qbackend.models import MODELS  # noqa: E402
from qbackend.report.plan_profile import profile_plan  # noqa: E402


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
        prof = profile_plan(q, *x, repeats=200)
    p, g = res["plan"], res["graph"]
    # the model's int8 layers the plan runs: a fused step (an inverted-residual block) runs several, "a+b+c"
    layers = len({name for s in prof.steps if s.layer is not None for name in s.layer.split("+")})
    over = prof.overhead_us[1]
    print(f"{name} b{batch}: {summary}", file=sys.stderr, flush=True)
    return (f"| {name} | {batch} | {p.min_us:.1f} / {p.median_us:.1f} | {g.min_us:.1f} / {g.median_us:.1f} | "
            f"{g.min_us / p.min_us:.2f}x | {len(prof.steps)} | {layers} | {prof.steps_sum_us[1]:.1f} | "
            f"{prof.entry_us[1]:.2f} | {prof.loop_us[1]:.2f} | {over / max(layers, 1):.2f} | "
            f"{over / max(len(prof.steps), 1):.2f} |")


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
        "| model | batch | plan forward | graph forward | graph / plan | steps | layers | sum of steps | Python entry | "
        "replay loop | overhead / layer | overhead / step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
