#!/usr/bin/env python
"""The op-level differential fuzzer, long-running (tests/fuzz/op_cases.py says what a case is and
how its outcome is judged).

    python tools/fuzz_ops.py --cases 100000 --seed 1
    QBACKEND_ISA=avx2 python tools/fuzz_ops.py --cases 20000 --seed 2 --families conv2d,linear

Case i is a pure function of (seed, i): its (family, provider) pair is the i-th of the rotation
over every family's providers, its draw random.Random(f"{seed}:{i}"), so one case can be replayed
with `--replay I`. Cases run in-process in child processes, a batch each; a child that dies (a
segfault) has its current case counted as crashed and printed, and the batch goes on in a new
child from the next case. Prints per family / provider the counts of passed, clear errors,
refused (the router never sends it there), wrong and crashed, then every distinct wrong answer
and crash with its case; exits 1 when any case is wrong or crashed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.child_runs import run_in_children  # noqa: E402


def pairs(families=None, providers=None):
    from tests.fuzz.op_cases import FAMILIES
    return [(f, p) for f, ps in FAMILIES.items() if not families or f in families
            for p in ps if not providers or p in providers]


def case_at(seed: int, i: int, rotation):
    from tests.fuzz.draw import RandomDraw
    from tests.fuzz.op_cases import draw_case
    family, provider = rotation[i % len(rotation)]
    return draw_case(RandomDraw(f"{seed}:{i}"), family, provider)


def worker(seed: int, start: int, end: int, rotation) -> None:
    """Runs cases [start, end): a line 'S i' before each and 'R i <json>' after it."""
    import torch

    from tests.fuzz.op_cases import run_case
    torch.set_num_threads(1)
    out = sys.stdout
    for i in range(start, end):
        case = case_at(seed, i, rotation)
        out.write(f"S {i}\n")
        out.flush()
        outcome, detail = run_case(case)
        out.write("R " + json.dumps({"i": i, "family": case["family"], "provider": case["provider"],
                                     "outcome": outcome, "detail": detail}) + "\n")
        out.flush()


def run_batch(args, start: int, end: int, on_result, on_crash) -> None:
    """Runs [start, end) in child processes, restarting after each crash."""
    extra = ["--seed", str(args.seed)]
    if args.families:
        extra += ["--families", args.families]
    if args.providers:
        extra += ["--providers", args.providers]
    run_in_children(__file__, start, end, extra, "i", on_result, on_crash)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="", help="comma-separated (default: all)")
    ap.add_argument("--providers", default="", help="comma-separated (default: all)")
    ap.add_argument("--batch", type=int, default=2000, help="cases per child process")
    ap.add_argument("--replay", type=int, default=None, help="print case I and run it in this process")
    ap.add_argument("--show", type=int, default=3, help="distinct wrong answers shown per family/provider")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    rotation = pairs(set(filter(None, args.families.split(","))), set(filter(None, args.providers.split(","))))
    if not rotation:
        ap.error("no (family, provider) pair selected")
    if args.worker:
        worker(args.seed, args.start, args.end, rotation)
        return 0
    if args.replay is not None:
        from tests.fuzz.op_cases import run_case
        case = case_at(args.seed, args.replay, rotation)
        print(json.dumps(case))
        print(run_case(case))
        return 0

    import torch

    from qbackend.core.extension import _C
    counts = collections.defaultdict(collections.Counter)
    wrong = collections.defaultdict(dict)
    crashes = []

    def on_result(r):
        counts[(r["family"], r["provider"])][r["outcome"]] += 1
        if r["outcome"] == "wrong":
            key = r["detail"][:50]
            wrong[(r["family"], r["provider"])].setdefault(key, (r["i"], r["detail"], 0))
            i, d, n = wrong[(r["family"], r["provider"])][key]
            wrong[(r["family"], r["provider"])][key] = (i, d, n + 1)

    def on_crash(i, rc, err):
        case = case_at(args.seed, i, rotation)
        counts[(case["family"], case["provider"])]["crashed"] += 1
        crashes.append((i, rc, case, err.strip().splitlines()[-1:] if err.strip() else []))
        print(f"CRASH case {i} (exit {rc}): {json.dumps(case)}", flush=True)

    t0 = time.time()
    for start in range(0, args.cases, args.batch):
        run_batch(args, start, min(args.cases, start + args.batch), on_result, on_crash)
    elapsed = time.time() - t0

    print(f"seed {args.seed}, {args.cases} cases in {elapsed:.0f} s; torch {torch.__version__}, "
          f"QBACKEND_ISA={os.environ.get('QBACKEND_ISA', '')!r}, native ISA {_C.native_isa() or 'none'}, "
          f"fbgemm ISA {_C.fbgemm_isa()}")
    cols = ("passed", "error", "refused", "wrong", "crashed")
    print(f"{'family':16s} {'provider':10s} " + " ".join(f"{c:>8s}" for c in cols))
    total = collections.Counter()
    for key in sorted(counts):
        total.update(counts[key])
        print(f"{key[0]:16s} {key[1]:10s} " + " ".join(f"{counts[key][c]:8d}" for c in cols))
    print(f"{'total':27s} " + " ".join(f"{total[c]:8d}" for c in cols))
    for key, found in sorted(wrong.items()):
        print(f"WRONG {key[0]} / {key[1]}: {len(found)} distinct")
        for i, detail, n in list(found.values())[:args.show]:
            print(f"  x{n} case {i}: {detail}\n    {json.dumps(case_at(args.seed, i, rotation))}")
    for i, rc, case, err in crashes:
        print(f"CRASHED case {i} exit {rc}: {json.dumps(case)} {err}")
    return 1 if total["wrong"] or total["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
