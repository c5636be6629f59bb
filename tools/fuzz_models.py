#!/usr/bin/env python
"""The model-level fuzzer, long-running (tests/fuzz/model_cases.py says what a model is and what
is checked).

    python tools/fuzz_models.py --models 1000 --seed 0 --compile-every 50
    QBACKEND_PROVIDER=reference python tools/fuzz_models.py --seeds 55,67   # fp64 kernels: is it the kernels?

Model i has seed S + i (its class rotates cnn, mlp, encoder). Models run in child processes, a
batch each; a child that dies has its model counted as crashed. Prints per class the count, the
SQNR distribution (min, 5th percentile, median) against the class floor, the failures (below the
floor, save/load not bit-identical, torch.compile against eager) and the crashes; exits 1 on any.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.child_runs import run_in_children  # noqa: E402


def worker(start: int, end: int, compile_every: int) -> None:
    import torch

    from tests.fuzz.model_cases import check_model
    torch.set_num_threads(1)
    for seed in range(start, end):
        print(f"S {seed}", flush=True)
        try:
            rec = check_model(seed, compile_=compile_every > 0 and seed % compile_every == 0)
        except Exception as e:  # noqa: BLE001  (an exception is a failure of the model, reported)
            rec = {"seed": seed, "class": "?", "failures": [f"raised {type(e).__name__}: {str(e)[:300]}"]}
        print("R " + json.dumps(rec), flush=True)


def run_span(args, start: int, end: int, recs: list, crashes: list, out=None) -> None:
    """Runs models [start, end) in child processes, restarting after a crash."""
    def on_result(rec):
        recs.append(rec)
        if out is not None:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if rec["failures"]:
            print(f"FAIL {json.dumps(rec)}", flush=True)

    def on_crash(seed, rc, _err):
        crashes.append((seed, rc))
        if out is not None:
            out.write(json.dumps({"seed": seed, "crashed": rc}) + "\n")
            out.flush()
        print(f"CRASH model {seed} (exit {rc})", flush=True)

    run_in_children(__file__, start, end, ["--compile-every", str(args.compile_every)], "seed", on_result, on_crash)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-every", type=int, default=0, help="torch.compile every N-th model (0: never)")
    ap.add_argument("--batch", type=int, default=50, help="models per child process")
    ap.add_argument("--seeds", default="", help="comma-separated model seeds to run instead of a range")
    ap.add_argument("--out", default="", help="append each model's record to this JSON-lines file")
    ap.add_argument("--summarize", nargs="*", default=None, help="only print the summary of these JSON-lines files")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.start, args.end, args.compile_every)
        return 0

    import torch

    from tests.fuzz.model_cases import FLOORS
    recs, crashes = [], []
    t0 = time.time()
    if args.summarize is not None:
        for path in args.summarize:
            for line in open(path):
                r = json.loads(line)
                (crashes.append((r["seed"], r["crashed"])) if "crashed" in r else recs.append(r))
        print(f"{len(recs)} models from {', '.join(args.summarize)}; torch {torch.__version__}")
    else:
        first, last = args.seed, args.seed + args.models
        spans = [(int(v), int(v) + 1) for v in args.seeds.split(",")] if args.seeds else \
            [(a, min(last, a + args.batch)) for a in range(first, last, args.batch)]
        out = open(args.out, "a") if args.out else None
        for start, end in spans:
            run_span(args, start, end, recs, crashes, out)
        elapsed = time.time() - t0
        print(f"{len(recs)} models (seeds {', '.join(f'{a}..{b - 1}' for a, b in spans[:1] + spans[-1:])}) in "
              f"{elapsed:.0f} s; torch {torch.__version__}, QBACKEND_ISA={os.environ.get('QBACKEND_ISA', '')!r}")
    by_class = collections.defaultdict(list)
    for r in recs:
        by_class[r["class"]].append(r)
    print(f"{'class':8s} {'models':>6s} {'floor':>6s} {'min':>6s} {'p5':>6s} {'median':>6s} {'failed':>6s} "
          f"{'compiled':>8s}")
    for cls, rs in sorted(by_class.items()):
        s = sorted(r["sqnr"] for r in rs if "sqnr" in r)
        p5 = s[max(0, int(0.05 * len(s)) - 1)] if s else float("nan")
        print(f"{cls:8s} {len(rs):6d} {FLOORS.get(cls, float('nan')):6.1f} {s[0] if s else float('nan'):6.1f} "
              f"{p5:6.1f} {statistics.median(s) if s else float('nan'):6.1f} "
              f"{sum(1 for r in rs if r['failures']):6d} {sum(1 for r in rs if 'compile_sqnr' in r):8d}")
    failed = [r for r in recs if r["failures"]]
    for r in failed:
        print(f"FAILED seed {r['seed']} ({r['class']}): {r['failures']}")
    print(f"failed {len(failed)}, crashed {len(crashes)}")
    return 1 if failed or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
