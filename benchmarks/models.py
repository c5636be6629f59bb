"""Whole-model INT8 speed and accuracy: qbackend against the float baselines and the other x86 INT8
flows, side by side, in one process per run with the flows' timings interleaved.

    python benchmarks/models.py [--models resnet18,bert_base] [--batch-sizes 1,32] [--threads 2]
                                [--peers torch_ao,pt2e,onnxruntime,openvino] [--quick] [--out FILE]

Flows (keys for --peers; FP32 eager, the reference, always runs):
  fp32              FP32 eager
  fp32_compile      FP32 torch.compile (Inductor, freezing)
  bf16              BF16 torch.autocast, eager
  torch_ao          torch.ao.quantization FX, get_default_qconfig_mapping("x86") (benchmarks/peers/torch_ao.py;
                    BERT cannot be FX-traced: it falls back to torch.ao dynamic quantization and says so)
  pt2e              torch.export + torchao X86InductorQuantizer + torch.compile (benchmarks/peers/pt2e.py)
  onnxruntime       ONNX Runtime static INT8, QDQ, per-channel weights (benchmarks/peers/onnxruntime_peer.py)
  openvino          OpenVINO INT8 via NNCF (benchmarks/peers/openvino_peer.py)
  qbackend          qbackend INT8 eager: qbackend.quantize(model, example_inputs, calibration), run as its
                    three steps (prepare = capture, calibrate, convert) to time the capture separately
  qbackend_compile  torch.compile of that same qbackend model

Every flow gets its own deep copy of the same FP32 model and the SAME calibration batches (4 batches
of 8 images / 8 sequences; --quick: 2 of 2). torch flows run under torch.no_grad() with
torch.set_num_threads(threads); ONNX Runtime gets intra_op_num_threads = threads (1 inter-op
thread), OpenVINO INFERENCE_NUM_THREADS = threads (latency hint, 1 stream). Inductor freezing is
switched on for the whole process (torchao's PT2E int8 lowering needs it, and it is the recommended
CPU inference setting), so it applies to every compiled flow. torch.compile uses dynamic=False:
each batch size gets its own specialised graph (OpenVINO likewise compiles one static-shape model
per batch size; ONNX Runtime runs one dynamic-batch session). Thread pools keep each library's
default (what a user gets: libgomp and ONNX Runtime busy-wait between regions); --passive makes them
wait passively (OMP_WAIT_POLICY=PASSIVE for torch's OpenMP, ONNX Runtime allow_spinning=0), the
second setting to report: on a shared 2-core machine busy-waiting makes every flow's time a measure
of the scheduler (see the comment above `import torch`), so run the default on an idle machine.

Measurement: each flow is built (export / quantize / compile, each timed: "export" = torch.export
or ONNX export or OpenVINO conversion or qbackend's capture, "quantize" = prepare + calibrate +
convert, "compile" = the first call at every timed batch size for torch.compile flows, session
creation or compile_model for ONNX Runtime / OpenVINO) and called once per batch size (a failing
flow becomes a row with its error). Then per batch size all the flows that work are timed together
with benchmarks/_timing.py's measure(): a warm-up, then rounds in which every flow runs one block
(an untimed call, then enough calls to last `block_s`), the order rotating from round to round, so
machine noise hits all flows alike; the time of a flow is the MEDIAN over its blocks (the least
disturbed block is shown beside it). Batch 1 is reported as latency (ms), larger batches as
throughput (items/s). Ratios are speed-ups (> 1 =
faster): against FP32 eager, and against the best peer = the fastest flow that is not qbackend's.

Accuracy: SQNR (dB) of each flow's output against FP32 eager on the largest timed batch (fresh
synthetic images / sequences, not calibration data; BERT: last_hidden_state).

Where qbackend (its faster variant) is slower than the best peer at a batch size, the report adds a
torch.profiler breakdown of qbackend's models at that batch size (top ops by self CPU time).

Sizes: images 224x224 (digits_cnn: its own 8x8 test images, the model trained on scikit-learn's digits), BERT-base (12 layers) sequence 128, encoder_384 (6 layers, 384 wide, the shape of
MiniLM-L6 sentence encoders) sequence 64; batch sizes 1 and 32 (BERT-base: 1 and 8; encoder_384: 32);
--quick: ResNet-18 on 64x64 images, batch sizes 1 and 4, a few short timing rounds (a smoke run for
CI, no meaningful numbers).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import importlib.util
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# Busy-waiting thread pools (libgomp's default, ONNX Runtime's default) collapse on a shared 2-core
# machine: a thread spinning at a barrier holds the core that its straggling partner, preempted by
# another process, needs. Measured here under load 6: qbackend ResNet-18 batch 1, median 58-89 ms
# with libgomp's default policy, 6-12 ms with OMP_WAIT_POLICY=PASSIVE; ONNX Runtime 33 ms spinning,
# 12 ms not. So by default the run switches spinning off where a knob exists (libgomp reads the
# variable when torch loads it, hence before the import). The default keeps the libraries' own
# policies, as a user runs them; --passive switches spinning off.
SPIN_WAIT = __name__ != "__main__" or "--passive" not in sys.argv[1:]
if not SPIN_WAIT:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import qbackend  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from _machine import git_commit  # noqa: E402
from _timing import measure  # noqa: E402
from accuracy import error_note, sqnr_db  # noqa: E402
from qbackend.models import MODELS as CASES  # noqa: E402
from qbackend.models.bert import bert_inputs  # noqa: E402
from qbackend.models.case import generator  # noqa: E402
from qbackend.models.synthetic import synthetic_images  # noqa: E402

MODELS = ("digits_cnn", "resnet18", "resnet50", "mobilenet_v2", "bert_base", "encoder_384")
# BERT-style encoders: name -> BertConfig overrides (bert_base's layer count comes from Sizes).
# encoder_384: 6 layers, hidden 384, 12 heads, FFN 1536 (the shape of MiniLM-L6 sentence encoders).
ENCODERS = {"bert_base": {}, "encoder_384": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                                                 intermediate_size=1536)}

# (key, label, python modules it needs, pip packages to install them)
FLOWS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("fp32", "FP32 eager", (), ""),
    ("fp32_compile", "FP32 torch.compile", (), ""),
    ("bf16", "BF16 autocast", (), ""),
    ("torch_ao", "torch.ao FX x86", (), ""),
    ("pt2e", "PT2E X86InductorQuantizer + compile", ("torchao",), "torchao"),
    ("onnxruntime", "ONNX Runtime INT8 (QDQ)", ("onnxruntime", "onnx", "onnxscript"), "onnxruntime onnx onnxscript"),
    ("openvino", "OpenVINO INT8 (NNCF)", ("openvino", "nncf"), "openvino nncf"),
    ("qbackend", "qbackend INT8 eager", (), ""),
    ("qbackend_compile", "qbackend INT8 torch.compile", (), ""),
]
SHORT = {"fp32": "FP32 eager", "fp32_compile": "FP32 compile", "bf16": "BF16", "torch_ao": "torch.ao FX",
         "pt2e": "PT2E", "onnxruntime": "ORT", "openvino": "OpenVINO", "qbackend": "qbackend eager",
         "qbackend_compile": "qbackend compile"}
LABEL = {k: label for k, label, _, _ in FLOWS}
QBACKEND_FLOWS = ("qbackend", "qbackend_compile")
INT8_PEERS = ("torch_ao", "pt2e", "onnxruntime", "openvino")


@dataclass(frozen=True)
class Sizes:
    image_size: int = 224
    seq_len: int = 128
    bert_layers: int = 12
    encoder_seq_len: int = 64  # encoder_384's sequence length
    calib_batch: int = 8
    calib_batches: int = 4
    batch_sizes: dict = field(default_factory=lambda: {"bert_base": (1, 8), "encoder_384": (32,)})
    default_batches: tuple = (1, 32)
    # timing (benchmarks/_timing.measure)
    blocks: int = 25
    block_s: float = 0.1
    warmup_s: float = 1.0
    budget_s: float = 40.0
    min_blocks: int = 7
    profile_iters: int = 10

    def batches(self, model: str) -> tuple[int, ...]:
        return tuple(self.batch_sizes.get(model, self.default_batches))


FULL = Sizes()
QUICK = Sizes(image_size=64, seq_len=32, bert_layers=2, encoder_seq_len=16, calib_batch=2, calib_batches=2,
              batch_sizes={"bert_base": (1, 2), "encoder_384": (2,)}, default_batches=(1, 4), blocks=3, block_s=0.02, warmup_s=0.02,
              budget_s=2.0, min_blocks=2, profile_iters=2)


class BertOutput(nn.Module):
    """BertModel -> last_hidden_state only, so that every flow (ONNX, OpenVINO included) has the
    same single tensor output. The pooler, whose output nobody uses then, may be dropped by the
    graph-capturing flows (a 768x768 layer on one token per sequence: negligible)."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]


@dataclass
class Bench:
    """One model's setup, shared by all flows."""

    name: str
    model: nn.Module
    calibration: list[tuple]
    inputs: dict[int, tuple]  # batch size -> the timed inputs
    threads: int
    tmpdir: str
    spin_wait: bool = True
    shared: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)  # batch -> (1-min load average before, after timing)

    @property
    def example(self) -> tuple:
        return self.calibration[0]

    @property
    def sqnr_batch(self) -> int:
        return max(self.inputs)

    @property
    def is_transformer(self) -> bool:
        return self.name in ENCODERS

    def fresh_model(self) -> nn.Module:
        return copy.deepcopy(self.model).eval()


@dataclass
class Built:
    run: Callable[..., torch.Tensor] | None = None
    export_s: float | None = None
    quantize_s: float | None = None
    compile_s: float | None = None
    note: str = ""


@dataclass
class Row:
    flow: str
    built: Built | None = None
    error: str = ""
    times: dict = field(default_factory=dict)      # batch -> median seconds per call
    min_times: dict = field(default_factory=dict)  # batch -> min seconds per call
    failed_at: dict = field(default_factory=dict)  # batch -> error
    sqnr: float | None = None


def build_bench(name: str, sizes: Sizes, threads: int, tmpdir: str, seed: int = 0) -> Bench:
    if name in ENCODERS:
        seq_len = sizes.seq_len if name == "bert_base" else sizes.encoder_seq_len
        overrides = {"num_hidden_layers": sizes.bert_layers, **ENCODERS[name]}
        if name != "bert_base" and sizes is QUICK:
            overrides["num_hidden_layers"] = 2
        case = CASES["bert_base"](batch_size=sizes.calib_batch, num_calibration_batches=sizes.calib_batches,
                                  num_eval_batches=1, seq_len=seq_len, seed=seed, **overrides)
        model = BertOutput(case.model).eval()
        vocab = case.model.config.vocab_size
        g = generator(seed + 4)
        inputs = {b: bert_inputs(b, seq_len, g, vocab) for b in sizes.batches(name)}
    elif name == "digits_cnn":  # trained on scikit-learn's digits: timed on its held-out 8x8 images
        with torch.enable_grad():  # the case trains the model (seconds, cached per seed)
            case = CASES[name](batch_size=sizes.calib_batch, num_calibration_batches=sizes.calib_batches,
                               num_eval_batches=1, seed=seed)
            test = torch.cat([b[0] for b in CASES[name](batch_size=32, num_calibration_batches=1,
                                                        seed=seed).evaluation])
        model = case.model
        inputs = {b: (test[:b].contiguous(),) for b in sizes.batches(name)}
    else:
        case = CASES[name](batch_size=sizes.calib_batch, num_calibration_batches=sizes.calib_batches,
                           num_eval_batches=1, image_size=sizes.image_size, seed=seed)
        model = case.model
        g = generator(seed + 4)
        inputs = {b: (synthetic_images(b, sizes.image_size, g),) for b in sizes.batches(name)}
    return Bench(name, model, case.calibration, inputs, threads, tmpdir, SPIN_WAIT)


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def _first_calls(bench: Bench, run) -> float:
    """One call per timed batch size (compiles where the flow compiles lazily); its total time."""
    t0 = time.perf_counter()
    for b in sorted(bench.inputs):
        run(*bench.inputs[b])
    return time.perf_counter() - t0


# ---- the flows: each returns a Built whose run(*inputs) returns the output tensor ----

def flow_fp32(bench: Bench) -> Built:
    return Built(run=bench.fresh_model())


def flow_fp32_compile(bench: Bench) -> Built:
    compiled = torch.compile(bench.fresh_model(), dynamic=False)
    return Built(run=compiled, compile_s=_first_calls(bench, compiled), note="Inductor, freezing, dynamic=False")


def flow_bf16(bench: Bench) -> Built:
    model = bench.fresh_model()

    def run(*inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(*inputs)

    return Built(run=run, note="torch.autocast('cpu', torch.bfloat16), eager")


def flow_torch_ao(bench: Bench) -> Built:
    from peers.torch_ao import torch_ao_static

    (qmodel, info), seconds = _timed(torch_ao_static, bench.fresh_model(), bench.example, bench.calibration)
    return Built(run=qmodel, quantize_s=seconds, note=info + "; quantize includes FX tracing")


def flow_pt2e(bench: Bench) -> Built:
    from peers import pt2e

    gm, export_s = _timed(pt2e.export_model, bench.fresh_model(), bench.example)
    (converted, info), quantize_s = _timed(pt2e.quantize_exported, gm, bench.calibration)
    compiled = pt2e.compile_model(converted)
    return Built(run=compiled, export_s=export_s, quantize_s=quantize_s, compile_s=_first_calls(bench, compiled),
                 note=f"torchao {pt2e.version()}; {info}")


def flow_onnxruntime(bench: Bench) -> Built:
    from peers import onnxruntime_peer as ortp

    fp32_path = os.path.join(bench.tmpdir, f"{bench.name}.onnx")
    int8_path = os.path.join(bench.tmpdir, f"{bench.name}.int8.onnx")
    _, export_s = _timed(ortp.export_onnx, bench.fresh_model(), bench.example, fp32_path)
    info, quantize_s = _timed(ortp.quantize_onnx, fp32_path, int8_path, bench.calibration)
    sess, compile_s = _timed(ortp.session, int8_path, bench.threads, bench.spin_wait)
    return Built(run=ortp.runner(sess), export_s=export_s, quantize_s=quantize_s, compile_s=compile_s,
                 note=f"{ortp.version()}; {info}; intra_op_num_threads={bench.threads}, "
                      f"allow_spinning={int(bench.spin_wait)}")


def flow_openvino(bench: Bench) -> Built:
    from peers import openvino_peer as ovp

    ov_model, export_s = _timed(ovp.convert, bench.fresh_model(), bench.example)
    (q, info), quantize_s = _timed(ovp.quantize, ov_model, bench.calibration, bench.is_transformer)
    t0 = time.perf_counter()
    runners, precision = {}, ""
    for b, inputs in bench.inputs.items():
        compiled = ovp.compile_for(q, [tuple(t.shape) for t in inputs], bench.threads)
        precision = ovp.precision(compiled)
        runners[b] = ovp.runner(compiled)
    compile_s = time.perf_counter() - t0

    def run(*inputs):
        return runners[inputs[0].shape[0]](*inputs)

    return Built(run=run, export_s=export_s, quantize_s=quantize_s, compile_s=compile_s,
                 note=f"{ovp.version()}; {info}; one static-shape model per batch size, INFERENCE_NUM_THREADS="
                      f"{bench.threads}, float ops in {precision} (OpenVINO's default)")


def _qbackend_model(bench: Bench):
    """qbackend.quantize(model, example, calibration) as its three steps (same result), timed."""
    if "qbackend" not in bench.shared:
        model = bench.fresh_model()
        prepared, export_s = _timed(qbackend.prepare, model, bench.example)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qbackend.calibrate(prepared, bench.calibration)
            qmodel = qbackend.convert(prepared)
        bench.shared["qbackend"] = (qmodel, export_s, time.perf_counter() - t0, prepared.method)
    return bench.shared["qbackend"]


def flow_qbackend(bench: Bench) -> Built:
    qmodel, export_s, quantize_s, method = _qbackend_model(bench)
    layers = getattr(qmodel, "qbackend_layers", None)
    n = len(layers) if layers is not None else "?"
    return Built(run=qmodel, export_s=export_s, quantize_s=quantize_s,
                 note=f"qbackend {qbackend.__version__}, default config, rule-based providers; capture: {method}; "
                      f"{n} int8 layers; {len(bench.calibration)} calibration batches")


def flow_qbackend_compile(bench: Bench) -> Built:
    qmodel, export_s, quantize_s, _ = _qbackend_model(bench)
    compiled = torch.compile(qmodel, dynamic=False)
    return Built(run=compiled, compile_s=_first_calls(bench, compiled),
                 note="torch.compile of the qbackend eager model (same quantization; its export/quantize times "
                      "are in the row above)")


BUILDERS = {
    "fp32": flow_fp32, "fp32_compile": flow_fp32_compile, "bf16": flow_bf16, "torch_ao": flow_torch_ao,
    "pt2e": flow_pt2e, "onnxruntime": flow_onnxruntime, "openvino": flow_openvino, "qbackend": flow_qbackend,
    "qbackend_compile": flow_qbackend_compile,
}


def missing_modules(flow: str) -> list[str]:
    needs = next(m for k, _, m, _ in FLOWS if k == flow)
    return [m for m in needs if importlib.util.find_spec(m) is None]


def main_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    raise TypeError(f"unexpected output type {type(out).__name__}")


def build_rows(bench: Bench, flows: list[str], verbose: bool) -> list[Row]:
    rows = []
    for flow in flows:
        row = Row(flow)
        rows.append(row)
        missing = missing_modules(flow)
        if missing:
            pip = next(p for k, _, _, p in FLOWS if k == flow)
            row.error = f"not installed: no module {', '.join(missing)} (pip install {pip}, or .[bench])"
            print(f"  {flow}: {row.error}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            built = BUILDERS[flow](bench)
            for b in sorted(bench.inputs):  # every batch size once: a flow failing at one is a row note
                try:
                    out = main_tensor(built.run(*bench.inputs[b]))
                    if b == bench.sqnr_batch:
                        bench.shared.setdefault("outputs", {})[flow] = out.detach().float().clone()
                except Exception as e:  # noqa: BLE001
                    row.failed_at[b] = error_note(e)
                    if verbose:
                        traceback.print_exc()
            row.built = built
        except Exception as e:  # noqa: BLE001  (a failing flow is a row, not a crash)
            row.error = error_note(e)
            if verbose:
                traceback.print_exc()
        status = row.error or ("ok" if not row.failed_at else f"fails at {sorted(row.failed_at)}")
        print(f"  {flow}: built in {time.perf_counter() - t0:.1f} s: {status}", flush=True)
        gc.collect()
    outputs = bench.shared.get("outputs", {})
    ref = outputs.get("fp32")
    for row in rows:
        if ref is not None and row.flow in outputs:
            row.sqnr = sqnr_db(ref, outputs[row.flow])
    return rows


def time_rows(bench: Bench, rows: list[Row], sizes: Sizes) -> None:
    for b in sorted(bench.inputs):
        inputs = bench.inputs[b]
        candidates = {r.flow: (lambda run=r.built.run: run(*inputs)) for r in rows
                      if r.built is not None and b not in r.failed_at}
        t0 = time.perf_counter()
        load0 = os.getloadavg()[0]
        res = measure(candidates, blocks=sizes.blocks, block_s=sizes.block_s, warmup_s=sizes.warmup_s,
                      budget_s=sizes.budget_s, min_blocks=sizes.min_blocks)
        for r in rows:
            if r.flow in res:
                r.times[b] = res[r.flow].median_us / 1e6
                r.min_times[b] = res[r.flow].min_us / 1e6
        bench.load[b] = (load0, os.getloadavg()[0])
        blocks = {f: t.blocks for f, t in res.items()}
        print(f"  batch {b}: timed in {time.perf_counter() - t0:.1f} s (blocks per flow: "
              f"{min(blocks.values()) if blocks else 0}-{max(blocks.values()) if blocks else 0})", flush=True)


# ---- profiling ----

def profile_table(run, inputs: tuple, iters: int, top: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    run(*inputs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            run(*inputs)
        wall = (time.perf_counter() - t0) / iters
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in events) / iters
    lines = [f"wall time per call under the profiler: {wall * 1e3:.2f} ms; self CPU time of all ops per call: "
             f"{total_self / 1e3:.2f} ms (the main thread's view: time in ops that run on both threads counts once)",
             "", "| op | self CPU per call (ms) | share of self CPU | calls per call |", "|---|---|---|---|"]
    for e in events[:top]:
        name = e.key if len(e.key) <= 70 else e.key[:67] + "..."
        lines.append(f"| `{name}` | {e.self_cpu_time_total / iters / 1e3:.3f} | "
                     f"{100 * e.self_cpu_time_total / iters / max(total_self, 1e-9):.1f}% | {e.count / iters:g} |")
    return "\n".join(lines)


def profiles(bench: Bench, rows: list[Row], sizes: Sizes, always: bool) -> list[str]:
    """Profiler tables of qbackend's models at each batch size where qbackend is not the fastest."""
    out = []
    by_flow = {r.flow: r for r in rows}
    for b in sorted(bench.inputs):
        why = []
        for stat, what in (("times", "median"), ("min_times", "min")):
            best_peer = _best(rows, b, exclude=QBACKEND_FLOWS, stat=stat)
            best_q = _best(rows, b, include=QBACKEND_FLOWS, stat=stat)
            if best_q is not None and best_peer is not None and getattr(best_peer, stat)[b] < getattr(best_q, stat)[b]:
                why.append(f"by {what}, qbackend's best ({LABEL[best_q.flow]}, {getattr(best_q, stat)[b] * 1e3:.2f} ms "
                           f"per batch) is behind {LABEL[best_peer.flow]} ({getattr(best_peer, stat)[b] * 1e3:.2f} ms)")
        if not why and not always:
            continue
        why = "; ".join(why) or "requested (--profile)"
        out.append(f"#### {bench.name}, batch {b}: where qbackend's time goes\n\n{why}.")
        for flow in QBACKEND_FLOWS:
            r = by_flow.get(flow)
            if r is None or r.built is None or b not in r.times:
                continue
            try:
                table = profile_table(r.built.run, bench.inputs[b], sizes.profile_iters)
            except Exception as e:  # noqa: BLE001
                table = f"profiling failed: {error_note(e)}"
            out.append(f"{LABEL[flow]}, batch {b}, {sizes.profile_iters} calls, top ops by self CPU time:\n\n{table}")
    return out


# ---- report ----

def _best(rows: list[Row], b: int, include=None, exclude=(), stat: str = "times") -> Row | None:
    """The fastest row at batch b by median ("times") or least disturbed block ("min_times")."""
    cands = [r for r in rows if b in r.times and r.flow not in exclude and (include is None or r.flow in include)]
    return min(cands, key=lambda r: getattr(r, stat)[b]) if cands else None


def _ms(seconds: float) -> str:
    """Milliseconds to 3 significant digits at least (0.0123, 1.23, 12.3)."""
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms >= 1 else f"{ms:.3g}" if ms >= 0.1 else f"{ms:.4f}"


def _fmt_time(seconds: float, b: int) -> str:
    if b == 1:
        return f"{_ms(seconds)} ms"
    return f"{b / seconds:.1f}/s"


def _fmt_cell(median: float, least: float, b: int) -> str:
    if b == 1:
        return f"{_ms(median)} ({_ms(least)})"
    return f"{b / median:.1f} ({b / least:.1f})"


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def model_table(bench: Bench, rows: list[Row]) -> str:
    batches = sorted(bench.inputs)
    fp32 = next((r for r in rows if r.flow == "fp32"), None)
    head = ["flow"]
    for b in batches:
        what = "latency ms, median (min)" if b == 1 else "items/s, median (best)"
        head += [f"batch {b}: {what}", "vs FP32 eager", "vs best peer", "vs best peer, min"]
    head += [f"SQNR vs FP32 (dB, batch {bench.sqnr_batch})", "export (s)", "quantize (s)", "compile (s)", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [LABEL[r.flow]]
        for b in batches:
            if b in r.times:
                t = r.times[b]
                best_peer = _best(rows, b, exclude=QBACKEND_FLOWS)
                best_peer_min = _best(rows, b, exclude=QBACKEND_FLOWS, stat="min_times")
                vs_fp32 = f"{fp32.times[b] / t:.2f}x" if fp32 is not None and b in fp32.times else "-"
                vs_peer = f"{best_peer.times[b] / t:.2f}x" if best_peer is not None else "-"
                vs_peer_min = (f"{best_peer_min.min_times[b] / r.min_times[b]:.2f}x" if best_peer_min is not None
                               else "-")
                cells += [_fmt_cell(t, r.min_times[b], b), vs_fp32, vs_peer, vs_peer_min]
            else:
                cells += ["failed" if b in r.failed_at else "-", "-", "-", "-"]
        sqnr = "-" if r.sqnr is None else ("exact" if math.isinf(r.sqnr) else f"{r.sqnr:.1f}")
        if r.flow == "fp32":
            sqnr = "reference"
        b_ = r.built
        note = r.error or (b_.note if b_ else "")
        for b, err in sorted(r.failed_at.items()):
            note += f"; batch {b} failed: {err}"
        cells += [sqnr, _fmt_s(b_ and b_.export_s), _fmt_s(b_ and b_.quantize_s), _fmt_s(b_ and b_.compile_s),
                  note.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    summary = []
    for b in batches:
        for stat, what in (("times", "median"), ("min_times", "least disturbed block")):
            best_peer = _best(rows, b, exclude=QBACKEND_FLOWS, stat=stat)
            best_q = _best(rows, b, include=QBACKEND_FLOWS, stat=stat)
            if best_peer and best_q:
                ratio = getattr(best_peer, stat)[b] / getattr(best_q, stat)[b]
                summary.append(f"batch {b} ({what}): best peer {LABEL[best_peer.flow]}, qbackend's best "
                               f"({LABEL[best_q.flow]}) at {ratio:.2f}x its speed")
        if b in bench.load:
            summary.append(f"batch {b}: 1-minute load average {bench.load[b][0]:.1f} before timing, "
                           f"{bench.load[b][1]:.1f} after")
    int8 = [r for r in rows if r.flow in INT8_PEERS and r.sqnr is not None]
    q = [r for r in rows if r.flow in QBACKEND_FLOWS and r.sqnr is not None]
    if int8 and q:
        bp = max(int8, key=lambda r: r.sqnr)
        summary.append(f"SQNR: qbackend {max(r.sqnr for r in q):.1f} dB, best INT8 peer {bp.sqnr:.1f} dB "
                       f"({LABEL[bp.flow]})")
    return "\n".join(lines) + ("\n\n" + "".join(f"- {x}.\n" for x in summary) if summary else "")


def headline(results: list[tuple[Bench, list[Row]]]) -> str:
    peers = [k for k, _, _, _ in FLOWS if k not in QBACKEND_FLOWS]
    head = ["model", "batch", "qbackend's best, median"] + [f"vs {SHORT[p]}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for bench, rows in results:
        by = {r.flow: r for r in rows}
        for b in sorted(bench.inputs):
            best_q = _best(rows, b, include=QBACKEND_FLOWS)
            if best_q is None:
                continue
            cells = [bench.name, str(b), f"{'compiled' if best_q.flow == 'qbackend_compile' else 'eager'} "
                                         f"({_fmt_time(best_q.times[b], b)})"]
            q_min = min(by[f].min_times[b] for f in QBACKEND_FLOWS if f in by and b in by[f].min_times)
            for p in peers:
                r = by.get(p)
                cells.append(f"{r.times[b] / best_q.times[b]:.2f}x ({r.min_times[b] / q_min:.2f}x)"
                             if r is not None and b in r.times else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
    return ("qbackend's faster variant (eager or torch.compile) against each flow: the flow's median time "
            "divided by qbackend's (> 1: qbackend is faster); in parentheses the same ratio of the least disturbed "
            "blocks (each side's minimum).\n\n" + "\n".join(lines))


def _pkg_version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:  # noqa: BLE001
        return "not installed"


def _cpu_info() -> tuple[str, str]:
    model, flags, family = platform.processor(), set(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k == "model name" and model in ("", platform.processor()):
                model = v.strip()
            elif k == "cpu family" and not family:
                family = v.strip()
            elif k == "flags" and not flags:
                flags = set(v.split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"]
    have = [f for f in wanted if f in flags]
    lacking = [f for f in wanted if f not in flags]
    return (f"{model}" + (f" (family {family})" if family else ""),
            f"has {' '.join(have)}; lacks {' '.join(lacking) or 'none of these'}")


def header(args, sizes: Sizes, names: list[str], flows: list[str], load: list[float], elapsed: float,
           started: str, commit: str) -> str:
    cpu, isa = _cpu_info()
    f = qbackend.cpu_features()
    versions = ", ".join(f"{p} {_pkg_version(p)}" for p in
                         ("torch", "torchao", "onnxruntime", "onnx", "onnxscript", "openvino", "nncf", "transformers",
                          "numpy"))
    amx = "yes" if f.amx_int8.cpu else "NO"
    bs = "; ".join(f"{n}: {', '.join(map(str, sizes.batches(n)))}" for n in names)
    pool = (f"its own pool (workers spin up to QBACKEND_SPIN_US={_C.spin_us()} us, yielding, then sleep)"
            if _C.own_pool() else "torch's OpenMP pool")
    return "\n".join([
        f"- CPU: {cpu}, {os.cpu_count()} logical CPUs; ISA flags: {isa}. AMX: {amx} "
        f"(qbackend's CPU class: {f.level_name}, VNNI: {f.has_vnni}).",
        f"- Threads: {args.threads} (torch.set_num_threads, ONNX Runtime intra-op, OpenVINO INFERENCE_NUM_THREADS). "
        f"Busy-waiting: {'the libraries defaults' if SPIN_WAIT else 'off where a knob exists (--passive)'}: "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset (libgomp spins)')} for torch's OpenMP pool "
        f"(every torch flow, qbackend's included), ONNX Runtime session.intra_op.allow_spinning={int(SPIN_WAIT)}; "
        "OpenVINO's TBB pool at its default (no knob). qbackend's own kernels run on "
        f"{pool} "
        "(QBACKEND_THREADING=auto: its own pool when OpenMP threads sleep).",
        f"- Packages: {versions}; qbackend {qbackend.__version__} (commit {commit} at the start); Python "
        f"{platform.python_version()}.",
        f"- Run: {'--quick' if args.quick else 'full'}; started {started}; "
        f"{elapsed / 60:.1f} min; 1-minute load average before / after: {load[0]:.2f} / {load[1]:.2f} (a shared "
        "machine: compare flows within a table, not across runs).",
        f"- Models: {', '.join(names)}; images {sizes.image_size}x{sizes.image_size}; BERT-base "
        f"{sizes.bert_layers} layers, sequence {sizes.seq_len}; encoder_384 (6 layers, hidden 384, 12 heads, FFN "
        f"1536) sequence {sizes.encoder_seq_len}; random weights, varied real lengths (attention mask); batch sizes "
        f"{bs}. Calibration: the same {sizes.calib_batches} batches of {sizes.calib_batch} for "
        "every flow.",
        f"- Timing: {sizes.blocks} interleaved rounds (a flow stops after {sizes.min_blocks} once it has spent "
        f"{sizes.budget_s:.0f} s), blocks of >= {sizes.block_s} s after {sizes.warmup_s} s of warm-up; times and "
        "ratios are medians over blocks; in parentheses the least disturbed block (min latency, best throughput).",
        f"- Flows: {', '.join(flows)}.",
    ])


def write_report(path: str | None, text: str) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        Path(path).write_text(text + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help=f"comma-separated, from: {', '.join(MODELS)} (default: all; "
                                                  "--quick: resnet18)")
    p.add_argument("--batch-sizes", default=None,
                   help="comma-separated batch sizes for every model (default 1,32 and BERT 1,8; --quick 1,4)")
    p.add_argument("--threads", type=int, default=2, help="threads for every flow (default 2)")
    p.add_argument("--peers", default=None,
                   help=f"flows besides FP32 eager, comma-separated (default all): "
                        f"{', '.join(k for k, _, _, _ in FLOWS if k != 'fp32')}")
    p.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few timing rounds")
    p.add_argument("--blocks", type=int, default=None, help="timing rounds (default 15; --quick 3)")
    p.add_argument("--profile", action="store_true", help="profile qbackend's models even where it is fastest")
    p.add_argument("--passive", action="store_true",
                   help="thread pools wait passively (OMP_WAIT_POLICY=PASSIVE, ONNX Runtime allow_spinning=0); "
                        "default: each library's own policy")
    p.add_argument("--cold-compile-cache", action="store_true",
                   help="a fresh Inductor cache directory, so compile times include code generation")
    p.add_argument("--out", default=None, help="write the markdown report here (rewritten after each model)")
    p.add_argument("--verbose", action="store_true", help="print the traceback of a failing flow")
    args = p.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    names = [n.strip() for n in (args.models or ("resnet18" if args.quick else ",".join(MODELS))).split(",")
             if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    if args.batch_sizes:
        try:
            bs = tuple(int(x) for x in args.batch_sizes.split(",") if x.strip())
        except ValueError:
            p.error(f"--batch-sizes must be integers, got {args.batch_sizes!r}")
        if not bs or min(bs) < 1:
            p.error("--batch-sizes must be positive")
        sizes = Sizes(**{**sizes.__dict__, "batch_sizes": {}, "default_batches": bs})
    if args.blocks:
        sizes = Sizes(**{**sizes.__dict__, "blocks": args.blocks, "min_blocks": min(sizes.min_blocks, args.blocks)})
    keys = [k for k, _, _, _ in FLOWS]
    flows = keys if args.peers is None else ["fp32"] + [x.strip() for x in args.peers.split(",") if x.strip()]
    bad = [f for f in flows if f not in keys]
    if bad:
        p.error(f"unknown flow(s) {bad}; known: {', '.join(keys)}")
    flows = [k for k in keys if k in flows]  # table order, no duplicates

    torch.set_num_threads(args.threads)
    torch.backends.quantized.engine = "x86"
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # see the docstring (PT2E's int8 lowering needs it globally)
    warnings.filterwarnings("ignore")
    tmpdir = tempfile.mkdtemp(prefix="qbackend-models-")
    if args.cold_compile_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmpdir, "inductor")
    load = [os.getloadavg()[0]]
    start = time.perf_counter()
    started, commit = datetime.datetime.now().isoformat(timespec="minutes"), git_commit()
    results: list[tuple[Bench, list[Row]]] = []
    sections: list[str] = []

    def report() -> str:
        head = header(args, sizes, names, flows, load + [os.getloadavg()[0]], time.perf_counter() - start, started,
                      commit)
        return "\n\n".join(["# Whole-model INT8 benchmarks: qbackend and its peers", head, "## Headline",
                            headline(results)] + sections)

    try:
        with torch.no_grad():
            for name in names:
                t0 = time.perf_counter()
                print(f"== {name}", flush=True)
                bench = build_bench(name, sizes, args.threads, tmpdir)
                rows = build_rows(bench, flows, args.verbose)
                time_rows(bench, rows, sizes)
                table = model_table(bench, rows)
                print(table, flush=True)
                prof = profiles(bench, rows, sizes, args.profile)
                results.append((bench, rows))
                sections.append("\n\n".join([f"## {name}", table] + prof))
                print(f"[{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
                write_report(args.out, report())
                for r in rows:  # keep the numbers, free the models
                    if r.built is not None:
                        r.built.run = None
                bench.model, bench.calibration = None, []
                bench.shared.clear()
                del bench, rows
                gc.collect()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    text = report()
    print("\n" + text)
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
