"""`qbackend demo`: train the digits CNN (qbackend.models.digits: scikit-learn's bundled 8x8
digits, no download, ~3 s), quantize it with `qbackend.quantize`, and compare FP32 with INT8:
test top-1, latency per batch (eager; median of interleaved rounds), speed ratio, model size
(FP32 state_dict file vs the `qbackend.save` file), and where each layer runs (qbackend.explain).

    from qbackend.cli.demo import run_demo, format_demo
    result = run_demo()          # a plain dict (what `qbackend demo --json FILE` writes)
    print(format_demo(result))
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from ..api import quantize
from ..core.version import VERSION
from ..dispatch import cpu_features
from ..report import explain
from ..models.digits import top1_percent, train_digits_cnn
from ..serialization import save
from .common import quiet_torch

DEFAULT_BATCH_SIZES = (1, 32)
CALIBRATION_BATCH = 32


def _interleaved_median_ms(models: dict, x: torch.Tensor, rounds: int, block_s: float = 0.004,
                           budget_s: float = 4.0) -> tuple[dict, int]:
    """Median wall time (ms) per call of each model on x, and the number of rounds run: after a
    warm-up, up to `rounds` rounds, each timing every model once (in rotated order) over a block of
    calls sized to ~block_s, so a machine slowdown hits all models alike; stops early (after at
    least 5 rounds) once `budget_s` has passed."""
    names = list(models)
    with torch.no_grad():
        inner = {}
        for name, m in models.items():
            for _ in range(3):
                m(x)
            one = []
            for _ in range(5):
                t0 = time.perf_counter()
                m(x)
                one.append(time.perf_counter() - t0)
            inner[name] = min(1000, max(1, int(block_s / max(statistics.median(one), 1e-7))))
        times: dict[str, list[float]] = {n: [] for n in names}
        start = time.perf_counter()
        done = 0
        for r in range(rounds):
            if done >= 5 and time.perf_counter() - start > budget_s:
                break
            for name in names[r % len(names):] + names[:r % len(names)]:
                m, n = models[name], inner[name]
                t0 = time.perf_counter()
                for _ in range(n):
                    m(x)
                times[name].append((time.perf_counter() - t0) / n)
            done += 1
    return {n: 1e3 * statistics.median(ts) for n, ts in times.items()}, done


def _state_dict_bytes(model: torch.nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return len(buf.getvalue())


def _saved_bytes(qmodel) -> int:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "digits.qb")
        save(qmodel, path)
        return os.path.getsize(path)


def _layer_lines(qmodel) -> list[dict]:
    rows = []
    for r in explain(qmodel):
        # routed by a rule: its condition (its evidence is in qbackend explain); else the whole why
        why = f"rule [{r['rule']}]" if r["rule"] is not None else r["why"]
        rows.append({"layer": r["layer"], "op": r["op"], "shape": r["shape"], "fused": r["fused"],
                     "output": r["output"], "provider": r["provider"], "why": why})
    return rows


def run_demo(batch_sizes=DEFAULT_BATCH_SIZES, threads: int | None = None, rounds: int = 40,
             epochs: int = 15, log=None) -> dict:
    """Train, quantize, measure. `log(msg)` (optional) is called with progress lines. Returns a
    JSON-able dict; format_demo turns it into the text `qbackend demo` prints."""
    log = log or (lambda msg: None)
    batch_sizes = tuple(int(b) for b in batch_sizes)
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be positive, got {batch_sizes!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be positive, got {rounds}")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    t_start = time.perf_counter()

    log(f"training the digits CNN on scikit-learn's 8x8 digits ({epochs} epochs, one thread) ...")
    model, split, train_s = train_digits_cnn(epochs=epochs)
    calibration = [(split.x_calib[i:i + CALIBRATION_BATCH],)
                   for i in range(0, len(split.x_calib), CALIBRATION_BATCH)]
    log(f"quantizing: {len(calibration)} calibration batches ({len(split.x_calib)} images) ...")
    t0 = time.perf_counter()
    with quiet_torch():
        qmodel = quantize(model, calibration[0], calibration)
    quantize_s = time.perf_counter() - t0

    with torch.no_grad():
        top1 = {"fp32": top1_percent(model, split.x_test, split.y_test),
                "int8": top1_percent(qmodel, split.x_test, split.y_test)}

    log(f"timing batch sizes {', '.join(map(str, batch_sizes))} ({rounds} interleaved rounds) ...")
    latency = []
    for b in batch_sizes:
        x = split.x_test[:b] if b <= len(split.x_test) else split.x_test[:1].expand(b, -1, -1, -1).contiguous()
        ms, done = _interleaved_median_ms({"fp32": model, "int8": qmodel}, x, rounds)
        latency.append({"batch": b, "fp32_ms": ms["fp32"], "int8_ms": ms["int8"],
                        "speedup": ms["fp32"] / ms["int8"], "rounds": done})

    with quiet_torch():
        size = {"fp32_state_dict_bytes": _state_dict_bytes(model), "int8_saved_bytes": _saved_bytes(qmodel)}

    f = cpu_features()
    return {
        "model": "digits CNN (Conv-BN-ReLU x2, MaxPool, Linear; scikit-learn 8x8 digits)",
        "machine": {"cpu": f.model_name or "?", "isa_class": f.isa_class, "threads": torch.get_num_threads(),
                    "torch": str(torch.__version__), "qbackend": VERSION},
        "data": {"train": len(split.y_train), "calibration": len(split.y_calib), "test": len(split.y_test)},
        "train_seconds": train_s,
        "quantize_seconds": quantize_s,
        "top1_percent": top1,
        "latency": latency,
        "size": size,
        "layers": _layer_lines(qmodel),
        "total_seconds": time.perf_counter() - t_start,
    }


def format_demo(r: dict) -> str:
    m, d, top1, size = r["machine"], r["data"], r["top1_percent"], r["size"]
    out = [
        f"{r['model']}",
        f"data: {d['train']} train / {d['calibration']} calibration / {d['test']} test images; "
        f"trained in {r['train_seconds']:.1f} s, quantized in {r['quantize_seconds']:.1f} s",
        f"machine: {m['cpu']} ({m['isa_class']}), {m['threads']} thread{'s' if m['threads'] != 1 else ''}, torch {m['torch']}",
        "",
        "| | FP32 | INT8 | INT8 vs FP32 |",
        "|---|---|---|---|",
        f"| test top-1 (%) | {top1['fp32']:.2f} | {top1['int8']:.2f} | {top1['int8'] - top1['fp32']:+.2f} points |",
    ]
    for row in r["latency"]:
        ratio = f"{row['speedup']:.2f}x faster" if row["speedup"] >= 1 else f"{1 / row['speedup']:.2f}x slower"
        out.append(f"| latency, batch {row['batch']} (ms) | {row['fp32_ms']:.3f} | {row['int8_ms']:.3f} | {ratio} |")
    out.append(f"| model size (bytes) | {size['fp32_state_dict_bytes']:,} | {size['int8_saved_bytes']:,} | "
               f"{size['fp32_state_dict_bytes'] / size['int8_saved_bytes']:.2f}x smaller |")
    out += ["",
            f"latency: eager, no grad, median of {min(row['rounds'] for row in r['latency'])} interleaved rounds; "
            "size: torch.save(state_dict) vs qbackend.save (int8 weights + graph + activation ranges)",
            "",
            "Layers (qbackend.explain):"]
    for row in r["layers"]:
        out.append(f"  {row['layer']:<8} {row['op']:<7} {row['shape']:<24} fused {row['fused']:<6} "
                   f"-> {row['output']:<8} {row['provider']:<7} {row['why']}")
    out.append("")
    out.append(f"total {r['total_seconds']:.1f} s")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    batch_sizes = _int_list(args.batch, "--batch")
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else None
    result = run_demo(batch_sizes=batch_sizes, threads=args.threads, rounds=args.rounds, epochs=args.epochs, log=log)
    print(format_demo(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{option} takes positive integers, got {text!r}")
    return values


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="train a small CNN on scikit-learn's digits, quantize it, and compare FP32 "
                                    "with INT8: top-1, latency, size, where each layer runs")
    d.add_argument("--batch", default="1,32", help="batch sizes to time, comma-separated (default 1,32)")
    d.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    d.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds per batch size (default 40)")
    d.add_argument("--epochs", type=int, default=15, help="training epochs (default 15)")
    d.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    d.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
