"""Model file size and load time: qbackend's format 2 (safetensors + JSON, no pickle) against
format 1 (a torch.save archive of the pickled model) and the FP32 model's state dict in a
safetensors file, for zoo models. Load time is `qbackend.load` (checks, rebuild, repacking every
weight, routing) vs `qbackend.load(allow_pickle=True)` of the format-1 file vs safetensors'
load_file; the median of --rounds interleaved rounds.

    python benchmarks/model_file.py [--models resnet18,mobilenet_v2,bert_base] [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

import qbackend
from qbackend.models import MODELS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402

SIZES = {"resnet18": dict(batch_size=1, image_size=224, num_calibration_batches=1, num_eval_batches=1),
         "mobilenet_v2": dict(batch_size=1, image_size=224, num_calibration_batches=1, num_eval_batches=1),
         "bert_base": dict(batch_size=1, seq_len=128, num_calibration_batches=1, num_eval_batches=1)}


def _format1(qmodel, path) -> None:
    """A format-1 file, as qbackend wrote them before format 2."""
    buf = io.BytesIO()
    torch.save(qmodel, buf)
    torch.save({"header": {"format": "qbackend-model", "version": 1}, "model": buf.getvalue()}, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2,bert_base")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from safetensors.torch import load_file, save_file

    warnings.simplefilter("ignore")
    lines = ["# Model file size (bytes) and load time", ""] + run_lines([torch.get_num_threads()]) + ["", "| model | FP32 safetensors | format 1 (pickle) | format 2 | load FP32 (ms) | "
                               "load format 1 (ms) | load format 2 (ms) |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            case = MODELS[name](**SIZES.get(name, {}))
            q = qbackend.quantize(case.model, case.example_inputs, case.calibration)
            paths = {k: os.path.join(d, f"{name}.{k}") for k in ("fp32", "v1", "v2")}
            save_file({k: v.contiguous() for k, v in case.model.state_dict().items()}, paths["fp32"])
            _format1(q, paths["v1"])
            qbackend.save(q, paths["v2"])
            loads = {"fp32": lambda: load_file(paths["fp32"]),
                     "v1": lambda: qbackend.load(paths["v1"], allow_pickle=True),
                     "v2": lambda: qbackend.load(paths["v2"])}
            times = {k: [] for k in loads}
            for _ in range(args.rounds):
                for k, fn in loads.items():
                    t0 = time.perf_counter()
                    fn()
                    times[k].append((time.perf_counter() - t0) * 1e3)
            size = {k: os.path.getsize(p) for k, p in paths.items()}
            med = {k: statistics.median(v) for k, v in times.items()}
            lines.append(f"| {name} | {size['fp32']:,} | {size['v1']:,} | {size['v2']:,} | {med['fp32']:.1f} | "
                         f"{med['v1']:.1f} | {med['v2']:.1f} |")
            print(lines[-1], flush=True)
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
