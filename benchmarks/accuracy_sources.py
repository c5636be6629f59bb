"""Where the INT8 error of the model zoo's CNNs comes from, and the measurements behind the defaults
of the post-training methods (GPTQ for convs, bias correction, the activation observer).

1. Decomposition. On the calibrated prepared graph (BatchNorm folded, qbackend's observers), the
   FP32 graph is run with fake quantization (quantize + dequantize in float64 arithmetic on float32
   values) of (a) the weights only (per output channel, symmetric int8, nearest rounding), (b) the
   observed activations only (each value's own qparams), (c) both. Output SQNR against FP32 on the
   evaluation batches says which error dominates: weight error is what GPTQ and bias correction
   can lower, activation error bounds any weight method (a model whose activations-only SQNR is
   below a target cannot reach it by weight rounding).
2. Activation observers: the whole qbackend flow (default config) with each activation observer.
3. Which convs take GPTQ: the flow with algorithms.gptq.ROWS_PER_FEATURE (a conv takes GPTQ where
   its example batch gives that many im2col rows per column) and SAMPLED_ROWS_PER_FEATURE (rows a
   batch contributes to H, per column) set to each pair, SQNR and quantize time.
4. Activation error by value (fake quantization of the activations only, as in 1): every observed
   value quantized, every one but the model's float input (the most a higher-precision input could
   give), and the values whose quantization ALONE lowers the output SQNR the most, each with its
   share of the summed error power of all values quantized one at a time (the random-init CNNs
   amplify early errors: the values near the input dominate).

    python benchmarks/accuracy_sources.py [--models resnet18,resnet50,mobilenet_v2] [--sections 1,2,3,4]
        [--out FILE]

Sizes: images 224, batch 8, 4 calibration / 2 evaluation batches (as benchmarks/accuracy.py).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import qbackend  # noqa: E402
from _machine import git_commit, write_report  # noqa: E402
from accuracy import sqnr_db  # noqa: E402
from qbackend.algorithms import gptq  # noqa: E402
from qbackend.config import ObserverSpec  # noqa: E402
from qbackend.lowering.fold import get_attr_value  # noqa: E402
from qbackend.lowering.prepare import ActivationObserver  # noqa: E402
from qbackend.models import MODELS  # noqa: E402

SIZES = dict(batch_size=8, image_size=224, num_calibration_batches=4, num_eval_batches=2)
OBSERVERS = {"histogram": ObserverSpec("histogram", {"dtype": torch.uint8}),
             "mse": ObserverSpec("mse", {"dtype": torch.uint8}),
             "percentile 99.999": ObserverSpec("percentile", {"dtype": torch.uint8, "percentile": 99.999}),
             "best_range (default)": ObserverSpec("best_range", {"dtype": torch.uint8})}
GPTQ_SETTINGS = ((2, 2), (2, 4), (1, 2), (0.5, 2))  # (ROWS_PER_FEATURE, SAMPLED_ROWS_PER_FEATURE)


@torch.no_grad()
def outputs(case, model) -> torch.Tensor:
    return torch.cat([case.output(model(*b)).reshape(-1).float() for b in case.evaluation])


def fake_quant(x: torch.Tensor, scale: float, zero_point: int, qmin: int, qmax: int) -> torch.Tensor:
    xd = x.double()
    return ((torch.clamp(torch.round(xd / scale) + zero_point, qmin, qmax) - zero_point) * scale).to(x.dtype)


def simulated(prepared, weights: bool, activations: bool, quantizes=None):
    """A copy of the prepared graph with fake-quantized weights and/or observed activations, its
    recorders removed (module docstring, 1); `quantizes(value_node)`, if given, says which observed
    values are fake-quantized (all of them otherwise)."""
    pg = prepared._prepared
    gm = copy.deepcopy(pg.gm)
    if weights:
        for op in pg.ops:
            w = get_attr_value(gm, op.weight)
            wd = w.detach().double()
            shape = (-1, *([1] * (wd.dim() - 1)))
            s = (wd.reshape(wd.shape[0], -1).abs().amax(1).clamp_min(1e-12) / 127).view(shape)
            w.data.copy_((torch.clamp(torch.round(wd / s), -127, 127) * s).float())
    for node in list(gm.graph.nodes):
        module = gm.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(module, ActivationObserver):
            value = node.args[0]
            if activations and (quantizes is None or quantizes(value)):
                qp = module.observer.compute_qparams()
                with gm.graph.inserting_after(node):
                    fq = gm.graph.call_function(fake_quant, (value, float(qp.scale), int(qp.zero_point), qp.qmin,
                                                             qp.qmax))
                value.replace_all_uses_with(fq, delete_user_cb=lambda u, fq=fq, node=node: u is not fq and u is not node)
            gm.graph.erase_node(node)
        elif module is not None and type(module).__name__ in ("HessianStats", "ChannelStats"):
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def decomposition(case, ref) -> list[str]:
    prepared = qbackend.prepare(copy.deepcopy(case.model), case.example_inputs)
    for batch in case.calibration:
        prepared(*batch)
    cells = [f"{sqnr_db(ref, outputs(case, simulated(prepared, w, a))):.2f}"
             for w, a in ((True, False), (False, True), (True, True))]
    return [f"| {case.name} | " + " | ".join(cells) + " |"]


TOP_VALUES = 5


def _producer(value) -> str:
    return value.op if value.op != "call_function" else str(getattr(value.target, "__name__", value.target)).split(".")[0]


def activation_values(case, ref) -> tuple[list[str], list[str]]:
    """Section 4's rows: (the model's line: all values, all but the input; its top values' lines)."""
    prepared = qbackend.prepare(copy.deepcopy(case.model), case.example_inputs)
    for batch in case.calibration:
        prepared(*batch)
    observed = [n.args[0] for n in prepared._prepared.gm.graph.nodes
                if n.op == "call_module" and isinstance(prepared._prepared.gm.get_submodule(n.target), ActivationObserver)]
    every = sqnr_db(ref, outputs(case, simulated(prepared, False, True)))
    but_input = sqnr_db(ref, outputs(case, simulated(prepared, False, True, lambda v: v.op != "placeholder")))
    alone = [(sqnr_db(ref, outputs(case, simulated(prepared, False, True, lambda v, name=value.name: v.name == name))),
              value) for value in observed]
    power = sum(10 ** (-s / 10) for s, _ in alone)
    line = f"| {case.name} | {len(observed)} | {every:.2f} | {but_input:.2f} | {-10 * math.log10(power):.2f} |"
    tops = [f"| {case.name} | {value.name} ({_producer(value)}) | {s:.2f} | {10 ** (-s / 10) / power:.3f} |"
            for s, value in sorted(alone, key=lambda t: t[0])[:TOP_VALUES]]
    return [line], tops


def quantized_sqnr(case, ref, config=None) -> tuple[float, float]:
    t0 = time.perf_counter()
    q = qbackend.quantize(copy.deepcopy(case.model), case.example_inputs, case.calibration, config=config)
    return sqnr_db(ref, outputs(case, q)), time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    p.add_argument("--sections", default="1,2,3,4", help="which of the module docstring's sections to run")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sections = {int(x) for x in args.sections.split(",") if x.strip()}
    warnings.filterwarnings("ignore")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    load = os.getloadavg()[0]
    decomp = ["| model | weights only | activations only | both |", "|---|---|---|---|"]
    observers = ["| model | " + " | ".join(OBSERVERS) + " |", "|---" * (len(OBSERVERS) + 1) + "|"]
    sweep = ["| model | rows per column to take GPTQ | rows per column into H | SQNR (dB) | quantize (s) |",
             "|---|---|---|---|---|"]
    values = ["| model | observed values | SQNR, all quantized | all but the model input | summed one at a time |",
              "|---|---|---|---|---|"]
    top = ["| model | value (producer) | SQNR with it alone quantized | share of the summed error power |",
           "|---|---|---|---|"]
    defaults = (gptq.ROWS_PER_FEATURE, gptq.SAMPLED_ROWS_PER_FEATURE)
    for name in names:
        case = MODELS[name](**SIZES)
        ref = outputs(case, case.model)
        if 4 in sections:
            line, tops = activation_values(case, ref)
            values += line
            top += tops
            print("\n".join(line + tops), flush=True)
        if 1 in sections:
            decomp += decomposition(case, ref)
        if 2 in sections:
            cells = [f"{quantized_sqnr(case, ref, qbackend.QuantConfig(activation=spec))[0]:.2f}"
                     for spec in OBSERVERS.values()]
            observers.append(f"| {name} | " + " | ".join(cells) + " |")
        for rows, sampled in (GPTQ_SETTINGS if 3 in sections else ()):
            gptq.ROWS_PER_FEATURE, gptq.SAMPLED_ROWS_PER_FEATURE = rows, sampled
            try:
                s, seconds = quantized_sqnr(case, ref)
            finally:
                gptq.ROWS_PER_FEATURE, gptq.SAMPLED_ROWS_PER_FEATURE = defaults
            mark = " (default)" if (rows, sampled) == defaults else ""
            sweep.append(f"| {name} | {rows}{mark} | {sampled} | {s:.2f} | {seconds:.1f} |")
        lines = ([decomp[-1]] if 1 in sections else []) + ([observers[-1]] if 2 in sections else []) + \
            (sweep[-len(GPTQ_SETTINGS):] if 3 in sections else [])
        print("\n".join(lines), flush=True)
    f = qbackend.cpu_features()
    header = (f"CPU: {f.model_name or platform.processor()}, {os.cpu_count()} logical CPUs ({f.level_name}); torch "
              f"threads {torch.get_num_threads()}; torch {torch.__version__}, qbackend commit {git_commit()}; "
              f"{datetime.date.today().isoformat()}; 1-minute load average before / after: {load:.2f} / "
              f"{os.getloadavg()[0]:.2f}. Sizes: {SIZES}.")
    parts = {1: ("## 1. Fake-quantization decomposition (output SQNR vs FP32, dB)", decomp),
             2: ("## 2. Activation observer (the whole default flow, SQNR dB)", observers),
             3: ("## 3. Which convs take GPTQ (the whole default flow)", sweep),
             4: ("## 4. Activation error by value (activations only, SQNR dB)", values + [""] + top)}
    report = "\n\n".join(["# Where the CNNs' INT8 error comes from, and the methods' settings", header] +
                           [f"{title}\n\n" + "\n".join(rows) for k, (title, rows) in sorted(parts.items())
                            if k in sections])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
