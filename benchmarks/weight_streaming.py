"""Weight streaming of the weight-only Linears at decoding (one row of x): GB/s of weight bytes that
qbackend::woq_linear, woq_a8_linear (W8A8), woq4_linear and woq4a8_linear (W4A8, groups of 32) reach
with their weights in DRAM (distinct layers, ~170 MB of int8 weights in all, called in turn), beside a
float sum over as many bytes (the read bandwidth a core gets), at 1 and 2 threads.

    python benchmarks/weight_streaming.py [--threads 1,2] [--rounds 5] [--out FILE]

Shapes: SmolLM2-135M's MLP (1536 x 576) and a 1024-wide Llama's (2816 x 1024 and 1024 x 2816). Best
of the rounds; every flow of a round runs before the next round starts.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402

from qbackend.nn import Int4WeightOnlyLinear, WeightOnlyLinear  # noqa: E402

SHAPES = {"1536 x 576": (1536, 576, 200), "2816 x 1024": (2816, 1024, 60), "1024 x 2816": (1024, 2816, 60)}
FLOWS = {"int8": lambda lin: WeightOnlyLinear.from_float(lin),
         "W8A8": lambda lin: WeightOnlyLinear.from_float(lin, activations="int8"),
         "int4 g32": lambda lin: Int4WeightOnlyLinear.from_float(lin, 32),
         "W4A8 g32": lambda lin: Int4WeightOnlyLinear.from_float(lin, 32, activations="int8")}


def _distinct(module):
    """The module with buffers of its own (no storage shared with another layer)."""
    for name, b in list(module._buffers.items()):
        if b is not None:
            module._buffers[name] = b.clone()
    return module


def _weight_bytes(n: int, k: int, flow: str) -> float:
    return n * k * (0.5 if flow.startswith(("int4", "W4")) else 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    gc.disable()
    rows = []
    for label, (n, k, count) in SHAPES.items():
        torch.manual_seed(0)
        sources = [torch.nn.Linear(k, n, bias=False) for _ in range(4)]
        layers = {flow: [_distinct(make(sources[i % 4])) for i in range(count)] for flow, make in FLOWS.items()}
        big = torch.ones(int(n * k * count / 4))  # as many bytes as the int8 weights, as float32
        x = torch.randn(1, k)
        for th in threads:
            torch.set_num_threads(th)
            best = {name: float("inf") for name in [*FLOWS, "sum"]}
            for _ in range(args.rounds + 1):  # the first round is untimed
                for flow, mods in layers.items():
                    t0 = time.perf_counter()
                    for m in mods:
                        m(x)
                    best[flow] = min(best[flow], time.perf_counter() - t0)
                t0 = time.perf_counter()
                big.sum()
                best["sum"] = min(best["sum"], time.perf_counter() - t0)
            rates = [_weight_bytes(n, k, f) * count / best[f] / 1e9 for f in FLOWS]
            total = big.numel() * 4 / best["sum"] / 1e9
            rows.append(f"| {label} | {th} | " + " | ".join(f"{r:.1f}" for r in rates) + f" | {total:.1f} |")
    report = "\n".join([
        "# Weight streaming of the weight-only Linears at decoding (M = 1)", "",
        *run_lines(threads),
        "- GB/s of weight bytes (int4: half a byte a weight), weights in DRAM: distinct layers called in turn, best "
        f"of {args.rounds} rounds; `sum`: torch's float sum over as many bytes as the int8 weights.", "",
        "| shape (N x K) | threads | " + " | ".join(FLOWS) + " | sum |",
        "|---|---|" + "---|" * (len(FLOWS) + 1), *rows])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
