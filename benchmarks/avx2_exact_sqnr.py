#!/usr/bin/env python
"""8-bit models loaded on AVX2-only CPUs: output SQNR against FP32 of zoo models quantized on this
CPU (its default ISA), saved with `qbackend.save` and loaded in child processes:

  * here:        this CPU's ISA (VNNI here: the 8-bit figure to keep);
  * avx2:        QBACKEND_ISA=avx2 (the native AVX2 GEMM keeps the 8-bit activations);
  * avx2 7-bit:  QBACKEND_ISA=avx2 with every uint8 activation requantized to 7 bits from its saved
                 range and the layers routed again: what loading did before the AVX2 GEMM.

    python benchmarks/avx2_exact_sqnr.py [--models resnet18,mobilenet_v2,bert_base] [--quick] [--out FILE]

The child rebuilds the model case from the same seed (the same evaluation batches) and compares its
outputs with the parent's FP32 outputs. Sizes: SIZES (full) or QUICK.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import qbackend  # noqa: E402
from _machine import run_lines  # noqa: E402
from qbackend.models import MODELS  # noqa: E402

SIZES = {
    "resnet18": dict(batch_size=4, image_size=224, num_calibration_batches=4, num_eval_batches=2),
    "mobilenet_v2": dict(batch_size=4, image_size=224, num_calibration_batches=4, num_eval_batches=2),
    "bert_base": dict(batch_size=2, seq_len=64, num_calibration_batches=4, num_eval_batches=2),
}
QUICK = {
    "resnet18": dict(batch_size=2, image_size=32, num_calibration_batches=2, num_eval_batches=1),
    "mobilenet_v2": dict(batch_size=2, image_size=32, num_calibration_batches=2, num_eval_batches=1),
    "bert_base": dict(batch_size=2, seq_len=16, num_calibration_batches=2, num_eval_batches=1, num_hidden_layers=2),
}
# (label, QBACKEND_ISA or None, requantize every activation to 7 bits after loading)
LOADS = (("here", None, False), ("avx2", "avx2", False), ("avx2 7-bit", "avx2", True))

CHILD = r'''
import json, math, sys, warnings, collections
import torch, qbackend
from qbackend.core.extension import _C
from qbackend.models import MODELS
from qbackend.nn.activation import uses_8_bits
from qbackend.serialization.rebind import requantize_activations, reroute
name, sizes, path, ref_path, seven = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
case = MODELS[name](**sizes)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    qm = qbackend.load(path)
if seven:
    requantize_activations(qm, True)
    reroute(qm)
with torch.no_grad():
    out = torch.cat([case.output(qm(*b)).detach().float().reshape(-1) for b in case.evaluation])
ref = torch.load(ref_path)
noise = float((ref.double() - out.double()).pow(2).sum())
sqnr = math.inf if noise == 0 else 10 * math.log10(float(ref.double().pow(2).sum()) / noise)
providers = collections.Counter(info.route.provider for info in qm.qbackend_layers.values() if info.route is not None)
acts = [r for r in qm.qbackend_activations.values() if r.dtype == "uint8"]
print(json.dumps({"sqnr": sqnr, "native": _C.native_isa(), "providers": dict(providers),
                  "uint8_8bit": sum(r.qmax > 127 for r in acts), "uint8_values": len(acts),
                  "warnings": [str(w.message)[:120] for w in caught if "7 bits" in str(w.message)]}))
'''


def run_child(name: str, sizes: dict, path: str, ref_path: str, isa: str | None, seven: bool) -> dict:
    env = dict(os.environ)
    env.pop("QBACKEND_ISA", None)
    if isa:
        env["QBACKEND_ISA"] = isa
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(sizes), path, ref_path, "1" if seven else "0"],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} under QBACKEND_ISA={isa}: child failed\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figures(name: str, sizes: dict, loads=LOADS) -> dict:
    """{load label: the child's record} for model `name`, quantized here with the default config."""
    case = MODELS[name](**sizes)
    with torch.no_grad():
        ref = torch.cat([case.output(case.model(*b)).detach().float().reshape(-1) for b in case.evaluation])
    qmodel = qbackend.quantize(copy.deepcopy(case.model), case.example_inputs, case.calibration)
    with tempfile.TemporaryDirectory() as d:
        path, ref_path = os.path.join(d, f"{name}.qb"), os.path.join(d, f"{name}_ref.pt")
        qbackend.save(qmodel, path)
        torch.save(ref, ref_path)
        return {label: run_child(name, sizes, path, ref_path, isa, seven) for label, isa, seven in loads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SIZES))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else SIZES
    lines = ["# 8-bit models loaded under QBACKEND_ISA=avx2: output SQNR against FP32", ""]
    lines += run_lines([torch.get_num_threads()])
    lines += ["- method: each model quantized here (`qbackend.quantize`, default config), saved with `qbackend.save`, "
              "loaded in a child process per row (`qbackend.load`: rebinding to that process's ISA); SQNR in dB of "
              "the case's output over its evaluation batches against FP32. `avx2 7-bit`: the same load with every "
              "uint8 activation requantized to 7 bits and the layers routed again (what loading under AVX2 did "
              "before the native AVX2 GEMM).", ""]
    lines += ["| model | sizes | here (8-bit) | avx2 | avx2 - here | avx2 7-bit | 8-bit values kept under avx2 | "
              "native kernel under avx2 | layers by provider under avx2 |", "|---|---|---|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        t0 = time.perf_counter()
        f = figures(name, sizes[name])
        here, avx2, seven = f["here"], f["avx2"], f["avx2 7-bit"]
        shown = ", ".join(f"{k}={v}" for k, v in sizes[name].items())
        lines.append(f"| {name} | {shown} | {here['sqnr']:.2f} | {avx2['sqnr']:.2f} | "
                     f"{avx2['sqnr'] - here['sqnr']:+.2f} | {seven['sqnr']:.2f} | "
                     f"{avx2['uint8_8bit']} of {avx2['uint8_values']} | `{avx2['native']}` | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(avx2['providers'].items()))} |")
        print(lines[-1], f"({time.perf_counter() - t0:.0f} s)", flush=True)
    lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
