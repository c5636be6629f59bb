"""Where a CNN's forward goes, layer by layer: qbackend's converted model beside OpenVINO's per-layer
performance counters on the same model, weights and calibration data.

    python benchmarks/layer_profile.py [--model mobilenet_v2] [--batch 1] [--threads 2] [--calls 40]
                                       [--rounds 7] [--no-fusions] [--out benchmarks/results/<cpu>/layer_profile_<model>_b<batch>.md]

qbackend: the model from qbackend.quantize (default config, forward plans on); each step of its
forward plan is timed by the replay (qbackend.report.plan_profile: a clock read between steps, no
profiler inside) and attributed to the layer whose module ran it; every other step (quantize,
pooling, views) is listed by its op. OpenVINO: NNCF's default INT8 quantization, compiled for this input shape (latency hint,
`--threads` threads) with PERF_COUNT on; its counters give each executed node's real time. OpenVINO
renames a conv after the scale it absorbed, so its k-th conv or fully connected node (with what it
fused) is matched to qbackend's k-th layer by order, where the counts agree; its other nodes (input
quantize and reorder, pooling) are listed apart.

Each side is timed (whole forwards, no profiler) and profiled in blocks of `--calls` forwards, the
sides alternating for `--rounds` rounds, each block after a 0.2 s pause (the other library's
spinning threads go idle) and 5 untimed forwards; each figure is the median over the rounds. The per-layer
sum against the whole forward shows each side's time outside its layers (dispatch, allocation).
On a shared machine whose speed drifts over seconds, `--calls 1` with more rounds (25) alternates the
sides every forward, so that the drift moves both alike: blocks of several forwards a side moved
per-layer ratios by about +-10% between runs on a KVM guest
(benchmarks/results/xeon_icelake/README.md, 2026-12-08).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import qbackend  # noqa: E402
from _machine import cpu_line, git_state, load_average, write_report  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.models import MODELS  # noqa: E402
from qbackend.models.case import generator  # noqa: E402
from qbackend.models.synthetic import synthetic_images  # noqa: E402
from qbackend.report.plan_profile import profile_plan  # noqa: E402

SETTLE_S = 0.2  # pause before each block: the other side's spinning thread pool goes idle
WARMUP = 5      # forwards before each block, untimed


def _settle(run, x) -> None:
    time.sleep(SETTLE_S)
    for _ in range(WARMUP):
        run(x)


def _block_time(run, x, calls: int) -> float:
    """Seconds per forward over `calls` forwards (after settling)."""
    _settle(run, x)
    t0 = time.perf_counter()
    for _ in range(calls):
        run(x)
    return (time.perf_counter() - t0) / calls


class QbackendSide:
    """qbackend's converted model: whole-forward time, and each step of its forward plan timed by
    the replay itself (qbackend.report.plan_profile: a clock read between steps, no profiler)."""

    def __init__(self, qmodel, x):
        self.qmodel, self.x = qmodel, x
        with torch.inference_mode():
            for _ in range(20):
                qmodel(x)

    def time(self, calls: int) -> float:
        with torch.inference_mode():
            return _block_time(self.qmodel, self.x, calls)

    def profile(self, calls: int) -> list[tuple[str, str, float]]:
        """[(layer or "-", op name, us per forward: the mean over `calls` replays, as OpenVINO's
        counters average)] in the order the plan runs the steps; `last` keeps the profile."""
        with torch.inference_mode():
            _settle(self.qmodel, self.x)
            prof = profile_plan(self.qmodel, self.x, repeats=calls)
        self.last = prof
        rows = []
        for st in prof.steps:  # a layer whose module runs several ops: one row, its steps summed
            if st.layer is not None and rows and rows[-1][0] == st.layer:
                rows[-1] = (st.layer, rows[-1][1], rows[-1][2] + st.mean_us)
            else:
                ns, _, rest = st.op.partition(".")  # "qbackend.native_conv2d.default" -> "qbackend::native_conv2d"
                name, _, overload = rest.partition(".")
                rows.append((st.layer or "-", f"{ns}::{name}" + (f".{overload}" if overload != "default" else ""),
                             st.mean_us))
        return rows


def _is_layer_node(info) -> bool:
    """An OpenVINO node that runs a conv or a fully connected layer (with what it fused)."""
    kind = info.exec_type.lower()
    return ("conv" in kind or "gemm" in kind or "conv" in info.node_type.lower()
            or info.node_type in ("FullyConnected", "MatMul"))


class OpenVinoSide:
    """OpenVINO INT8 (NNCF defaults) compiled for x's shape with PERF_COUNT on: whole-forward time,
    and each executed node's real time from its counters."""

    def __init__(self, model, calibration, x, threads: int):
        import openvino as ov

        from peers import openvino_peer

        q, _ = openvino_peer.quantize(openvino_peer.convert(model, (x,)), calibration)
        m = q.clone()
        m.reshape({m.inputs[0]: ov.PartialShape(list(x.shape))})
        settings = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        core = ov.Core()
        self.compiled = core.compile_model(m, "CPU", {**settings, "PERF_COUNT": True})
        self.plain = core.compile_model(m, "CPU", settings)  # timed: no counters
        self.precision = openvino_peer.precision(self.compiled)
        self.request = self.compiled.create_infer_request()
        self.plain_request = self.plain.create_infer_request()
        self.arr = x.numpy()
        self.x = x
        for _ in range(20):
            self._run(x)
            self._run_plain(x)

    def _run(self, _):
        self.request.infer([self.arr], share_inputs=True)

    def _run_plain(self, _):
        self.plain_request.infer([self.arr], share_inputs=True)

    def time(self, calls: int) -> float:
        return _block_time(self._run_plain, self.x, calls)

    def profile(self, calls: int) -> list[tuple[str, str, bool, float]]:
        """[(node name, exec type, is a layer, us per forward)] in execution order."""
        sums: dict = collections.OrderedDict()
        _settle(self._run, self.x)
        for _ in range(calls):
            self._run(self.x)
            for info in self.request.get_profiling_info():
                if info.real_time.total_seconds() <= 0:
                    continue
                us, _, _ = sums.get(info.node_name, (0.0, None, None))
                sums[info.node_name] = (us + info.real_time.total_seconds() * 1e6, info.exec_type,
                                        _is_layer_node(info))
        return [(name, kind, layer, us / calls) for name, (us, kind, layer) in sums.items()]


def _median(values):
    v = sorted(values)
    return v[len(v) // 2]


def interleaved(q: QbackendSide, o: OpenVinoSide, rounds: int, calls: int):
    """Both sides timed and profiled in alternation, `rounds` times; per row and for the totals the
    median over the rounds."""
    q_times, o_times, q_runs, o_runs = [], [], [], []
    for _ in range(rounds):
        q_times.append(q.time(calls))
        o_times.append(o.time(calls))
        q_runs.append(q.profile(calls))
        o_runs.append(o.profile(calls))
    q_rows = [(label, name, _median([run[i][2] for run in q_runs])) for i, (label, name, _) in enumerate(q_runs[0])]
    o_rows = [(name, kind, layer, _median([run[i][3] for run in o_runs if i < len(run)]))
              for i, (name, kind, layer, _) in enumerate(o_runs[0])]
    return _median(q_times), q_rows, _median(o_times), o_rows


def _shape(rec) -> str:
    s = rec.shape
    if rec.kind == "linear":
        return f"linear {s.get('k')}->{s.get('n')}"
    k = s["kernel"]
    kind = "dw" if s["groups"] > 1 and s["groups"] == s["c_in"] else f"{k[0]}x{k[1]}"
    return f"{kind} {s['c_in']}->{s['c_out']} @{s['h']} s{s['stride'][0]}"


def _macs(rec, batch: int) -> int:
    """Multiply-adds of one layer at this batch size (from its record's example shape)."""
    s = rec.shape
    if rec.kind == "linear":
        return batch * s["k"] * s["n"]
    oh = (s["h"] + 2 * s["padding"][0] - (s["kernel"][0] - 1) - 1) // s["stride"][0] + 1
    ow = (s["w"] + 2 * s["padding"][1] - (s["kernel"][1] - 1) - 1) // s["stride"][1] + 1
    return batch * oh * ow * s["c_out"] * (s["c_in"] // s["groups"]) * s["kernel"][0] * s["kernel"][1]


def _of_peak(macs: int, us: float, peak_ops: float) -> str:
    return f"{100 * 2 * macs / (us * 1e-6) / peak_ops:.0f}%" if us > 0 else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2", choices=["digits_cnn", "mobilenet_v2", "resnet18", "resnet50"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=40, help="forwards per block")
    ap.add_argument("--rounds", type=int, default=7, help="blocks per side, the sides alternating")
    ap.add_argument("--no-fusions", action="store_true",
                    help="qbackend without cross-layer fusions (QuantConfig(fusions=False)): one row per layer")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model == "digits_cnn":  # its own images (1x32x32, from scikit-learn's digits)
        case = MODELS[args.model](batch_size=8, num_calibration_batches=4, num_eval_batches=1, seed=0)
        x = torch.cat([case.calibration[0][0]] * ((args.batch + 7) // 8))[:args.batch].contiguous()
    else:
        case = MODELS[args.model](batch_size=8, num_calibration_batches=4, num_eval_batches=1, image_size=224, seed=0)
        x = synthetic_images(args.batch, 224, generator(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = qbackend.QuantConfig(fusions=False) if args.no_fusions else None
        qmodel = qbackend.quantize(case.model, (x,), case.calibration, config=config)
    o_side = OpenVinoSide(case.model, case.calibration, x, args.threads)
    q_side = QbackendSide(qmodel, x)
    q_total, q_rows, ov_total, ov_rows = interleaved(q_side, o_side, args.rounds, args.calls)
    peak = max(_C.native_peak_ops(2_000_000, args.threads) for _ in range(5))
    precision = o_side.precision

    lines = [f"# Per-layer time: qbackend and OpenVINO, {args.model}, batch {args.batch}", "", cpu_line(),
             f"- threads: {args.threads}; torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()}); "
             f"OpenVINO float ops in {precision}",
             f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start "
             f"{load_average()}",
             f"- command: `python benchmarks/layer_profile.py --model {args.model} --batch {args.batch} "
             f"--threads {args.threads} --calls {args.calls} --rounds {args.rounds}"
             + (" --no-fusions" if args.no_fusions else "") + "`",
             f"- us per forward, the median over {args.rounds} blocks of {args.calls} forwards per side, the sides "
             "alternating; qbackend: each step of the forward plan timed by the replay (a clock read between steps; "
             "the mean over the block's replays); OpenVINO: PERF_COUNT real time per node (the mean over the "
             "block); whole forwards timed apart (qbackend without the clock reads, OpenVINO without counters)",
             f"- % of peak: a layer's multiply-adds (2 int8 ops each) per second against the VNNI dot-product peak of "
             f"{args.threads} threads measured here (`qbackend._C.native_peak_ops`: {peak / 1e12:.3f} TOPS); a fused "
             "block of qbackend's (several layers in one step) is one row, beside the sum of OpenVINO's nodes for "
             "the same layers", ""]
    ov_layer_rows = [r for r in ov_rows if r[2]]
    q_layers = [name for label, _, _ in q_rows if label != "-" for name in label.split("+")]
    matched = len(ov_layer_rows) == len(q_layers)
    lines += ["The k-th conv or fully connected node of OpenVINO (its convs are renamed after the scale it "
              "absorbed) is matched to the k-th int8 layer of qbackend: " + ("the counts agree." if matched else
              f"the counts differ ({len(ov_layer_rows)} against {len(q_layers)}): no OpenVINO column."), "",
              "| layer | shape | qbackend op | qbackend us | OpenVINO us | OpenVINO kernel | qbackend / OpenVINO | "
              "qbackend % of peak | OpenVINO % of peak |",
              "|---|---|---|---|---|---|---|---|---|"]
    by_kind = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    k = 0
    for label, op, us in q_rows:
        if label == "-":
            lines.append(f"| - | - | `{op}` | {us:.1f} | - | - | - | - | - |")
            by_kind["other ops"][0] += us
            continue
        recs = [qmodel.qbackend_layers[name] for name in label.split("+")]
        shape = " + ".join(_shape(rec) for rec in recs)
        kinds = [_shape(rec).split(" ")[0] if rec.kind == "conv2d" else "linear" for rec in recs]
        kind = "stem" if recs[0].kind == "conv2d" and recs[0].shape["c_in"] < 16 else kinds[0]
        kind = f"fused {'+'.join(kinds)}" if len(recs) > 1 else kind
        macs = sum(_macs(rec, args.batch) for rec in recs)
        by_kind[kind][0] += us
        by_kind[kind][2] += len(recs)
        by_kind[kind][3] += macs
        ov = "- | - | - | -"
        if matched:
            nodes = ov_layer_rows[k:k + len(recs)]
            ov_us = sum(r[3] for r in nodes)
            by_kind[kind][1] += ov_us
            ov = (f"{ov_us:.1f} | {', '.join(sorted({r[1] for r in nodes}))} | {us / ov_us:.2f} | "
                  f"{_of_peak(macs, us, peak)} | {_of_peak(macs, ov_us, peak)}")
        else:
            ov = f"- | - | - | {_of_peak(macs, us, peak)} | -"
        k += len(recs)
        layer = label if len(recs) == 1 else f"{recs[0].module.rpartition('.')[0]} ({len(recs)} layers)"
        lines.append(f"| {layer} | {shape} | `{op.split('::')[1]}` ({recs[0].route.provider}) | {us:.1f} | {ov} |")
    rest = [r for r in ov_rows if not (matched and r[2])]
    for _, _, _, us in rest:
        by_kind["other ops"][1] += us
    lines += ["", "OpenVINO's other nodes (input quantize and reorder, pooling, what it did not fuse):", "",
              "| node | us | kernel |", "|---|---|---|"]
    lines += [f"| `{name[:90]}` | {us:.1f} | {kind} |" for name, kind, _, us in rest if us >= 0.5]
    q_sum = sum(us for _, _, us in q_rows)
    ov_sum = sum(r[3] for r in ov_rows)
    lines += ["", "## By kind", "", "| kind | layers | qbackend us | OpenVINO us | qbackend / OpenVINO | "
              "qbackend % of peak | OpenVINO % of peak |", "|---|---|---|---|---|---|---|"]
    for kind, (qu, ou, n, macs) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        ratio = f"{qu / ou:.2f}" if ou and qu else "-"
        lines.append(f"| {kind} | {n or '-'} | {qu:.1f} | {ou:.1f} | {ratio} | "
                     f"{_of_peak(macs, qu, peak) if macs else '-'} | {_of_peak(macs, ou, peak) if macs and ou else '-'} |")
    lines += [f"| sum of the rows | | {q_sum:.1f} | {ov_sum:.1f} | {q_sum / ov_sum:.2f} |",
              f"| whole forward (timed without the per-step clock / counters) | | {q_total * 1e6:.1f} | "
              f"{ov_total * 1e6:.1f} | {q_total / ov_total:.2f} |",
              f"| outside the rows | | {q_total * 1e6 - q_sum:.1f} | {ov_total * 1e6 - ov_sum:.1f} | |",
              f"| outside the rows, per layer ({len(q_layers)} layers) | | {(q_total * 1e6 - q_sum) / len(q_layers):.2f} | "
              f"{(ov_total * 1e6 - ov_sum) / max(len(ov_layer_rows), 1):.2f} | |",
              "", "The time outside the rows compares means over different blocks, so other load on the machine moves "
              "it. Taken within single calls instead (qbackend.report.plan_profile, qbackend's last block, medians "
              f"over its {args.calls} calls): the Python entry (a forward less the replay inside it) "
              f"{q_side.last.entry_us[1]:.2f} us plus the replay loop (a replay less its steps) "
              f"{q_side.last.loop_us[1]:.2f} us = {q_side.last.overhead_us[1]:.2f} us per forward, "
              f"{q_side.last.overhead_us[1] / len(q_layers):.2f} us per layer "
              f"({q_side.last.overhead_per_step_us(1):.2f} us per step of {len(q_side.last.steps)}).",
              "", f"Load average at the end: {load_average()}."]
    write_report("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
