"""MobileNetV2 quantized with its inverted-residual blocks fused (qbackend::native_inverted_residual:
the expansion, depthwise and projection convs in tiles of rows whose expanded activation stays in
L2) against the same model with QuantConfig(fusions=False) (each layer its own op, on its
rule-table provider, as before the fusion existed), at batch 1 and 32: whole forwards interleaved,
then each block's step times inside the native plan replays. The measurement behind the fusion
table's inverted_residual row in qbackend/dispatch/rules.py.

    python benchmarks/inverted_residual.py [--threads 2] [--quick] [--out benchmarks/results/<cpu>/inverted_residual.md]

Whole forwards are timed interleaved (benchmarks/_timing.py): median and least disturbed block per
call; ratio = layer by layer / fused (> 1: the fusion is faster). The zoo's random-init MobileNetV2
(qbackend.models.mobilenet), calibrated on its synthetic images.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from _timing import fmt_us, measure  # noqa: E402

import qbackend  # noqa: E402
from qbackend.dispatch.rules import fusion  # noqa: E402
from qbackend.models.mobilenet import mobilenet_v2_case  # noqa: E402
from qbackend.report.plan_profile import profile_plan  # noqa: E402

def _row(cells):
    return "| " + " | ".join(cells) + " |"


def _block_steps(profile, fused: bool) -> dict[str, list[float]]:
    """Median step time per block ("features.3") in us: the fused step, or the sum of the block's
    layer steps."""
    out: dict[str, float] = {}
    for s in profile.steps:
        path = s.module or ""
        parts = path.split(".")
        if len(parts) < 3 or parts[0] != "features" or parts[2] != "conv":
            continue
        if fused and "fused_" not in path:
            continue
        key = ".".join(parts[:2])
        out[key] = out.get(key, 0.0) + s.median_us
    return out


def block_table(models, batches, quick):
    """Per block: the fused model's one step against the unfused model's three layer steps, each
    timed inside native plan replays (no Python between the ops), both models profiled in turn."""
    lines = ["| block | batch | layer by layer (3 steps) | fused (1 step) | ratio |", "|---|---|---|---|---|"]
    for n in batches:
        x = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(n))
        sums = {"separate": {}, "fused": {}}
        for _ in range(2 if quick else 3):
            for name, m in models.items():
                p = profile_plan(m, x, repeats=(20 if quick else 60) if n == 1 else (3 if quick else 8))
                for k, v in _block_steps(p, name == "fused").items():
                    sums[name].setdefault(k, []).append(v)
        total_s = total_f = 0.0
        for block in sorted(sums["fused"], key=lambda b: int(b.split(".")[1])):
            s = statistics.median(sums["separate"][block])
            f = statistics.median(sums["fused"][block])
            total_s, total_f = total_s + s, total_f + f
            lines.append(_row([block, str(n), fmt_us(s), fmt_us(f), f"{s / f:.2f}x"]))
        lines.append(_row(["**all blocks**", str(n), fmt_us(total_s), fmt_us(total_f),
                           f"**{total_s / total_f:.2f}x**"]))
    return lines


def model_table(models, batches, quick):
    fused, separate = models["fused"], models["separate"]
    lines = ["| batch | fusions=False: median (min) | fused: median (min) | ratio (median) | ratio (min) | "
             "max abs output difference |", "|---|---|---|---|---|---|"]
    for n in batches:
        x = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            diff = float((fused(x) - separate(x)).abs().max())
            r = measure({"separate": lambda: separate(x), "fused": lambda: fused(x)}, blocks=5 if quick else 15,
                        block_s=0.05, budget_s=8.0)
        s, f = r["separate"], r["fused"]
        lines.append(_row([str(n), f"{fmt_us(s.median_us)} ({fmt_us(s.min_us)})",
                           f"{fmt_us(f.median_us)} ({fmt_us(f.min_us)})", f"{s.median_us / f.median_us:.2f}x",
                           f"{s.min_us / f.min_us:.2f}x", f"{diff:.3g}"]))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer blocks per row (a smoke run)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    isa_class = qbackend.cpu_features().isa_class
    if fusion("inverted_residual", isa_class) is None:
        print(f"the fusion table (qbackend.dispatch.rules.FUSIONS) has no inverted_residual row for the CPU class "
              f"{isa_class}: both models would be the same (add the class to the row to measure it)")
        return 0
    batches = (1, 32)
    case = mobilenet_v2_case()
    models = {"separate": qbackend.quantize(case.model, case.example_inputs, case.calibration,
                                            config=qbackend.QuantConfig(fusions=False)),
              "fused": qbackend.quantize(case.model, case.example_inputs, case.calibration)}
    blocks = sum(type(m).__name__ == "QuantizedInvertedResidual" for m in models["fused"].modules())
    report = ["# Inverted-residual blocks: fused vs layer by layer", "", *run_lines([args.threads]),
              "- thread pools at their defaults (no OMP_WAIT_POLICY set)" if "OMP_WAIT_POLICY" not in os.environ
              else f"- OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", "",
              ]
    report += ["## The whole MobileNetV2 (224 x 224): fused against QuantConfig(fusions=False)", "",
               f"{blocks} blocks fused. Without the fusion each layer runs on its rule-table provider (some of "
               "the strided depthwise convs and the first projection on oneDNN at batch 32), so the outputs "
               "differ where those providers round a tie the other way; the fused model equals its own layers "
               "run one by one bit for bit (tests/lowering/test_inverted_residual.py).", "",
               *model_table(models, batches, args.quick), "",
               "## Each block: its fused step against its layers' steps", "",
               "Median step times inside native plan replays (qbackend.report.plan_profile), the two models "
               "profiled in turn; the layer-by-layer steps run on the rule table's providers.", "",
               *block_table(models, batches, args.quick)]
    write_report("\n".join(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
