"""qbackend's quantize time (prepare, calibrate, convert) per zoo model, with capture's fast path
(lowering/functionalize.py) and with torch.export's run_decompositions({}) in its place, in one
process, interleaved (fast, slow, fast, slow ...; the minimum over rounds reported).

    python benchmarks/quantize_time.py [--models mobilenet_v2,resnet18] [--rounds 2] [--threads 2]
                                       [--out benchmarks/results/<cpu>/quantize_time.md]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402

import qbackend  # noqa: E402
from qbackend.lowering import capture as capture_module  # noqa: E402
from qbackend.lowering.functionalize import functionalize  # noqa: E402
from qbackend.models import MODELS  # noqa: E402


def _once(case, fast: bool) -> tuple[float, float, float]:
    capture_module.functionalize = functionalize if fast else (lambda gm: False)
    t0 = time.perf_counter()
    prepared = qbackend.prepare(case.model, case.example_inputs)
    t1 = time.perf_counter()
    qbackend.calibrate(prepared, case.calibration)
    t2 = time.perf_counter()
    qbackend.convert(prepared)
    return t1 - t0, time.perf_counter() - t2, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet18,resnet50")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models.split(","):
        case = MODELS[name](batch_size=1, num_calibration_batches=8, num_eval_batches=1)
        best = {True: [float("inf")] * 3, False: [float("inf")] * 3}
        for _ in range(args.rounds):
            for fast in (True, False):
                best[fast] = [min(a, b) for a, b in zip(best[fast], _once(case, fast))]
                print(f"{name} {'fast' if fast else 'decomp'}: {best[fast]}", file=sys.stderr, flush=True)
        f, s = best[True], best[False]
        rows.append(f"| {name} | {f[0]:.1f} / {s[0]:.1f} | {f[1]:.1f} / {s[1]:.1f} | {f[2]:.1f} / {s[2]:.1f} | "
                    f"{s[2] / f[2]:.2f}x |")
    report = "\n".join(["# qbackend quantize time: capture's fast path against run_decompositions", "",
                        *run_lines([args.threads]),
                        f"- method: batch-1 example at 224x224, 8 calibration batches, default config; seconds, "
                        f"minimum of {args.rounds} interleaved rounds; `fast` = lowering/functionalize.py, "
                        "`decomp` = ExportedProgram.run_decompositions({})", "",
                        "| model | prepare fast / decomp (s) | convert fast / decomp (s) | total fast / decomp (s) | "
                        "total speed-up |", "|---|---|---|---|---|", *rows])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
