"""Quantize time per zoo model: qbackend's whole flow (prepare, which captures the model, then
calibrate and convert) against each peer's whole flow from the same FP32 model to an INT8 model
(torch.ao FX: prepare_fx + calibration + convert_fx; PT2E: export + prepare_pt2e + calibration +
convert_pt2e; ONNX Runtime: ONNX export + quant_pre_process + quantize_static; OpenVINO: convert_model
+ nncf.quantize), on the same calibration batches as benchmarks/models.py (4 batches of 8 images),
in one process, the flows interleaved round by round (each round starting one flow later, a pause
between flows); compiling for inference is not counted.
Each flow's first round runs untimed (imports, first-call set-up), then the minimum and median of
the timed rounds; qbackend also split into its three steps (minimum over rounds).

    python benchmarks/quantize_time.py [--models digits_cnn,mobilenet_v2,resnet18,resnet50]
        [--flows qbackend,torch_ao,pt2e,onnxruntime,openvino] [--rounds 3] [--threads 2]
        [--out benchmarks/results/<cpu>/quantize_time.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from models import FULL, build_bench  # noqa: E402

import qbackend  # noqa: E402

LABELS = {"qbackend": "qbackend", "torch_ao": "torch.ao FX x86", "pt2e": "PT2E X86InductorQuantizer",
          "onnxruntime": "ONNX Runtime QDQ", "openvino": "OpenVINO NNCF"}


def _qbackend(bench) -> dict:
    t0 = time.perf_counter()
    prepared = qbackend.prepare(bench.fresh_model(), bench.example)
    t1 = time.perf_counter()
    qbackend.calibrate(prepared, bench.calibration)
    t2 = time.perf_counter()
    qbackend.convert(prepared)
    t3 = time.perf_counter()
    return {"total": t3 - t0, "prepare": t1 - t0, "calibrate": t2 - t1, "convert": t3 - t2}


def _torch_ao(bench) -> dict:
    from peers.torch_ao import torch_ao_static

    t0 = time.perf_counter()
    torch_ao_static(bench.fresh_model(), bench.example, bench.calibration)
    return {"total": time.perf_counter() - t0}


def _pt2e(bench) -> dict:
    from peers import pt2e

    t0 = time.perf_counter()
    gm = pt2e.export_model(bench.fresh_model(), bench.example)
    pt2e.quantize_exported(gm, bench.calibration)
    return {"total": time.perf_counter() - t0}


def _onnxruntime(bench) -> dict:
    from peers import onnxruntime_peer as ortp

    fp32_path = os.path.join(bench.tmpdir, f"{bench.name}.onnx")
    int8_path = os.path.join(bench.tmpdir, f"{bench.name}.int8.onnx")
    t0 = time.perf_counter()
    ortp.export_onnx(bench.fresh_model(), bench.example, fp32_path)
    ortp.quantize_onnx(fp32_path, int8_path, bench.calibration)
    return {"total": time.perf_counter() - t0}


def _openvino(bench) -> dict:
    from peers import openvino_peer as ovp

    t0 = time.perf_counter()
    ovp.quantize(ovp.convert(bench.fresh_model(), bench.example), bench.calibration, bench.is_transformer)
    return {"total": time.perf_counter() - t0}


# Seconds between two flows, for worker threads that spin after their last region (OpenMP's,
# OpenVINO's) to go to sleep before the next flow is timed; and each round starts one flow later, so
# that no flow is always timed right after the same peer.
SETTLE_S = 1.0

FLOWS = {"qbackend": _qbackend, "torch_ao": _torch_ao, "pt2e": _pt2e, "onnxruntime": _onnxruntime,
         "openvino": _openvino}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits_cnn,mobilenet_v2,resnet18,resnet50")
    ap.add_argument("--flows", default=",".join(FLOWS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    flows = [f for f in args.flows.split(",") if f]
    unknown = [f for f in flows if f not in FLOWS]
    if unknown:
        ap.error(f"unknown flows {unknown}; choose from {', '.join(FLOWS)}")
    sections = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in args.models.split(","):
            bench = build_bench(name, FULL, args.threads, tmpdir)
            times: dict[str, list[dict]] = {f: [] for f in flows}
            errors: dict[str, str] = {}
            for r in range(args.rounds + 1):
                for flow in flows[r % len(flows):] + flows[:r % len(flows)]:  # each flow after another each round
                    if flow in errors:
                        continue
                    time.sleep(SETTLE_S)  # the previous flow's spinning thread pools (OpenVINO's, OpenMP's) go idle
                    try:
                        t = FLOWS[flow](bench)
                    except Exception as exc:  # noqa: BLE001  (a peer that cannot quantize this model: reported)
                        errors[flow] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
                        continue
                    if r > 0:
                        times[flow].append(t)
                    print(f"{name} {flow} round {r}: {t['total']:.2f} s", file=sys.stderr, flush=True)
            sections.append(_section(name, flows, times, errors))
    report = "\n".join([
        "# Quantize time: qbackend's flow against the peers'", "",
        *run_lines([args.threads]),
        f"- method: zoo models as benchmarks/models.py builds them (224x224 images; the digits CNN 8x8 upsampled "
        f"to 32x32), its calibration batches (4 of 8) for every flow; each flow from the FP32 model to an INT8 "
        f"model (export / capture included, compiling for inference not); one untimed round, then {args.rounds} "
        f"timed rounds, the flows interleaved (each round starting one flow later, {SETTLE_S:g} s between flows); "
        f"seconds; {time.time() - started:.0f} s in all.",
        "- qbackend's split: prepare (capture with torch.export, BatchNorm folding, observers) / calibrate / "
        "convert, each its minimum over the rounds.", "", *sections])
    write_report(report, args.out)
    return 0


def _section(name: str, flows: list[str], times: dict, errors: dict) -> str:
    best = {f: min(t["total"] for t in times[f]) for f in flows if times[f]}
    peers = {f: v for f, v in best.items() if f != "qbackend"}
    fastest = min(peers, key=peers.get) if peers else None
    lines = [f"## {name}", "", "| flow | min (s) | median (s) | fastest peer's min / this min | notes |",
             "|---|---|---|---|---|"]
    for f in flows:
        if f in errors:
            lines.append(f"| {LABELS[f]} | - | - | - | failed: {errors[f]} |")
            continue
        if not times[f]:
            continue
        med = statistics.median(t["total"] for t in times[f])
        ratio = f"{best[fastest] / best[f]:.2f}x" if fastest else "-"
        note = ""
        if f == "qbackend":
            parts = {k: min(t[k] for t in times[f]) for k in ("prepare", "calibrate", "convert")}
            note = " / ".join(f"{k} {v:.2f}" for k, v in parts.items())
        lines.append(f"| {LABELS[f]} | {best[f]:.2f} | {med:.2f} | {ratio} | {note} |")
    if fastest and "qbackend" in best:
        lines += ["", f"- fastest peer: {LABELS[fastest]} ({best[fastest]:.2f} s); qbackend "
                      f"{best['qbackend']:.2f} s: {'within' if best['qbackend'] <= best[fastest] else 'over'} the "
                      "target (<= the fastest peer's flow)."]
    return "\n".join(lines + [""])


if __name__ == "__main__":
    sys.exit(main())
