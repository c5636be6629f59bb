"""The AVX512-VNNI GEMM's read ahead of activation rows, on and off, step by step through converted
CNNs (and BERT-base): the measurement behind `rows_read_ahead` (csrc/kernels/gemm_kernels.h).

    python benchmarks/rows_read_ahead.py [--models resnet50,resnet18,mobilenet_v2,bert_base] [--batches 1,32]
                                         [--pairs 0] [--threads 2] [--out FILE]

Each model is quantized once; its forward plan is then replayed in pairs (read ahead off, on; the
order alternating from pair to pair), each replay timing every step (a clock read between steps).
A pair's two replays run back to back, so a shared machine's speed, which drifts over seconds,
moves both alike: the table gives, per kind of layer, the geometric mean over its steps of each
step's median on / off ratio over the pairs (< 1: faster with the read ahead), and the same for
the sum of the steps. The output bytes are the same either way (the read ahead only prefetches).
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import load_average, run_lines, write_report  # noqa: E402

import qbackend  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.models import MODELS, bert_inputs  # noqa: E402
from qbackend.models.case import generator  # noqa: E402
from qbackend.models.synthetic import synthetic_images  # noqa: E402


def kind(qmodel, layer: str | None) -> str:
    """The row label of a plan step run by `layer` (a layer name, "a+b" for a fused block, or None)."""
    if layer is None:
        return "ops between layers"
    if "+" in layer:
        return "fused block"
    rec = qmodel.qbackend_layers[layer]
    if rec.kind != "conv2d":
        return rec.kind
    s = rec.shape
    if s["groups"] > 1:
        return "depthwise conv"
    if s["c_in"] < 16:
        return "stem"
    if tuple(s["kernel"]) != (1, 1):
        return f"{s['kernel'][0]}x{s['kernel'][1]}"
    return "1x1, C_in > C_out" if s["c_in"] > s["c_out"] else "1x1, C_in <= C_out"


def measure(model: str, batch: int, pairs: int, seed: int = 0) -> tuple[list[str], dict, list[float]]:
    if model == "bert_base":  # 128-token sequences (BERT's vocabulary), its default 12 layers
        case = MODELS[model](batch_size=8, num_calibration_batches=4, num_eval_batches=1, seq_len=128, seed=seed)
        x = bert_inputs(batch, 128, generator(seed + 4), case.model.config.vocab_size)
    else:
        case = MODELS[model](batch_size=8, num_calibration_batches=4, num_eval_batches=1, image_size=224, seed=seed)
        x = (synthetic_images(batch, 224, generator(seed + 4)),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qmodel = qbackend.quantize(case.model, x, case.calibration)
    ratios, totals = collections.defaultdict(list), []
    try:
        with torch.no_grad():
            qmodel(*x)
            qmodel(*x)
            plan, tensors = qmodel.recorded_plan(*x)
            if plan is None:
                raise RuntimeError(f"{model}: no forward plan for batch {batch}")
            for i in range(pairs):
                ns = {}
                for on in ((False, True) if i % 2 == 0 else (True, False)):
                    _C.set_native_rows_read_ahead(on)
                    out, ns[on] = plan.run_timed(tensors)
                steps = len(ns[True]) - 1
                for j in range(steps):
                    ratios[j].append(ns[True][j] / ns[False][j])
                totals.append(sum(ns[True][:steps]) / sum(ns[False][:steps]))
    finally:
        _C.set_native_rows_read_ahead(True)
    return [kind(qmodel, layer) for layer in plan.step_layers(qmodel.layer_by_module())], ratios, totals


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,resnet18,mobilenet_v2",
                    help="zoo CNNs (224 x 224 images) and bert_base (128-token sequences)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--pairs", type=int, default=0, help="replay pairs per model and batch (0: 150 at batch 1, "
                                                         "24 above)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if _C.native_isa() != "avx512_vnni":
        print(f"the read ahead is the AVX512-VNNI kernel's; this CPU's native kernel is {_C.native_isa()!r}")
        return 0
    torch.set_num_threads(args.threads)
    lines = ["# The AVX512-VNNI GEMM's read ahead of activation rows: on / off, step by step", "",
             *run_lines([args.threads]),
             "- method: benchmarks/rows_read_ahead.py's docstring (pairs of plan replays, off and on back to back, "
             "thread pools at their defaults); per kind: the geometric mean over its steps of each step's median "
             "on / off time ratio (< 1: faster with the read ahead), its range over the steps", "",
             "| model | batch | pairs | kind | steps | on / off | range |", "|---|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            pairs = args.pairs or (150 if batch == 1 else 24)
            kinds, ratios, totals = measure(model, batch, pairs)
            by_kind = collections.defaultdict(list)
            for j, k in enumerate(kinds):
                by_kind[k].append(statistics.median(ratios[j]))
            for k in sorted(by_kind):
                v = by_kind[k]
                lines.append(f"| {model} | {batch} | {pairs} | {k} | {len(v)} | {geomean(v):.3f} | "
                             f"{min(v):.3f}-{max(v):.3f} |")
            lines.append(f"| {model} | {batch} | {pairs} | **all steps summed** | {len(kinds)} | "
                         f"{statistics.median(totals):.3f} | - |")
    lines += ["", f"Load average at the end: {load_average()}."]
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
