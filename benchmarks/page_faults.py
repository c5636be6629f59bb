"""Page faults per forward of the converted zoo CNNs, with qbackend's activation cache
(csrc/runtime/activation_cache.h) off and on, interleaved in one process: minor page faults,
system CPU time and wall time per forward (resource.getrusage; fault counts do not depend on the
machine's load, times do).

    python benchmarks/page_faults.py [--models mobilenet_v2,resnet50] [--batch 32] [--threads 2]
                                     [--rounds 4] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import load_average, run_lines  # noqa: E402

import qbackend  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.models import MODELS  # noqa: E402


def per_forward(q, x, calls: int = 3) -> tuple[float, float, float]:
    """(minor faults, system ms, wall ms) per forward, averaged over `calls` forwards."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(calls):
        q(x)
    wall = (time.perf_counter() - t0) / calls
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return (r1.ru_minflt - r0.ru_minflt) / calls, 1e3 * (r1.ru_stime - r0.ru_stime) / calls, 1e3 * wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet18,resnet50")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    limit = _C.activation_cache_limit() or (1024 << 20)
    lines = ["# Page faults per forward, activation cache off / on", ""] + run_lines([args.threads])
    lines += [f"- batch {args.batch}; {args.rounds} interleaved rounds of 3 forwards per setting; medians over "
              "rounds", "", "| model | cache | minor faults / forward | system ms / forward | wall ms / forward |",
              "|---|---|---|---|---|"]
    for name in args.models.split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case = MODELS[name](batch_size=8, num_calibration_batches=2, num_eval_batches=1)
            q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
        x = torch.cat([case.calibration[0][0]] * ((args.batch + 7) // 8))[:args.batch]
        res = {"off": [], "on": []}
        with torch.no_grad():
            for _ in range(2):
                q(x)
            for _ in range(args.rounds):
                for setting in ("off", "on"):
                    _C.set_activation_cache_limit(0 if setting == "off" else limit)
                    q(x)  # the first forward of a setting fills (or drains) the cache
                    res[setting].append(per_forward(q, x))
        _C.set_activation_cache_limit(limit)
        for setting, rows in res.items():
            med = [sorted(col)[len(col) // 2] for col in zip(*rows)]
            lines.append(f"| {name} | {setting} | {med[0]:,.0f} | {med[1]:.1f} | {med[2]:.1f} |")
        print(lines[-2], lines[-1], sep="\n", flush=True)
    lines += ["", f"Load average at the end: {load_average()}."]
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
