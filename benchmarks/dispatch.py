#!/usr/bin/env python
"""Dispatch benchmark: is each quantized layer of a real model routed to the faster provider?

    python benchmarks/dispatch.py [--quick] [--models resnet50,mobilenet_v2,bert_base] [--threads 2]
                                  [--out FILE]

For every model and batch size (ResNet-50 and MobileNetV2 at 224x224, batch 1 and 32; the BERT-base
encoder at 1 x 128 and 8 x 128 tokens):

1. the model is prepared with an example batch of that size and calibrated on two batches, then
   converted from the same prepared model five ways: by the rule table (`qbackend.convert`), by
   tune mode twice (`convert(tune=True)`, each time with a fresh TuneCache in a temporary file, to
   see whether tuned choices flip between runs), and with every layer on one provider, for each
   provider (native where it can run the layer, FBGEMM, oneDNN: `QBACKEND_PROVIDER` set around
   `convert`; same qparams, same graph). When the layers
   were recorded with another batch than the real one (torch.export hints size-1 dimensions as 2),
   also by tune mode at the real batch (`tune_batch_sizes=(batch,)`).
2. Per layer: each quantized layer's real inputs are captured (forward pre-hooks, one run of the
   rule-table model on a held-out batch); the layer's module from each all-<provider> model is timed
   on them, interleaved in short blocks (benchmarks/_timing.py). With several threads each layer
   is also timed at 1 thread, and re-measured while a provider's best block is far over its
   1-thread best (an OpenMP call stalled by other processes: on a busy 2-CPU machine that costs a
   scheduler quantum, milliseconds, not microseconds). A layer whose rule or tuned choice looks
   slow is re-measured with more blocks. Ratios are a choice's best block over the faster
   provider's (minima: the least disturbed blocks); medians are printed too.
3. Whole model: rule-table, tuned, every all-<provider> model and the FP32 eager model, interleaved,
   one call per block, on the held-out batch; ratios to the fastest all-<provider> model on minima, on
   medians, and paired within each round. With several threads, the int8 models again at 1 thread
   on process CPU time (insensitive to being descheduled), and the per-layer summaries also on the
   1-thread minima.

The targets: rule-table choice within 1.10x of the fastest provider on every layer, tuned
choice within 1.05x, whole-model latency of both at most the fastest single provider's. Nothing is
asserted: timings never set the exit code (the machine may be shared and noisy).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Timing, fmt_us, measure  # noqa: E402
from _machine import load_average, run_lines  # noqa: E402
from int8_kernels import Report, onednn_reorders  # noqa: E402

import qbackend  # noqa: E402
from qbackend.dispatch import ENV_PROVIDER  # noqa: E402
from qbackend.dispatch.rules import choose  # noqa: E402
from qbackend.dispatch.tuner import TuneCache  # noqa: E402
from qbackend.models import MODELS  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)  # FP32-op lists, export notes: not this benchmark's topic
warnings.filterwarnings("ignore", category=FutureWarning)

RULE_TARGET = 1.10
TUNE_TARGET = 1.05
# Every kernel provider this CPU runs (the native one needs AVX512-VNNI).
PROVIDERS = (("native",) if _C.native_isa() else ()) + ("fbgemm", "onednn")
FIXED = tuple(f"all-{p}" for p in PROVIDERS)  # the models with every layer forced to one provider
BASE = "min(" + ", ".join(FIXED) + ")"


# ---------------------------------------------------------------------------------------------
# settings

@dataclass(frozen=True)
class ModelSpec:
    name: str
    batches: tuple[int, ...]
    kwargs: dict = field(default_factory=dict)

    def label(self, batch: int) -> str:
        if "seq_len" in self.kwargs:
            return f"{self.name} {batch}x{self.kwargs['seq_len']}"
        if "image_size" in self.kwargs:
            return f"{self.name} batch {batch} @{self.kwargs['image_size']}"
        return f"{self.name} batch {batch}"


FULL_MODELS = {
    "resnet50": ModelSpec("resnet50", (1, 32), {"image_size": 224}),
    "mobilenet_v2": ModelSpec("mobilenet_v2", (1, 32), {"image_size": 224}),
    "bert_base": ModelSpec("bert_base", (1, 8), {"seq_len": 128}),
    "resnet18": ModelSpec("resnet18", (1, 32), {"image_size": 224}),
}
QUICK_MODELS = {
    "resnet50": ModelSpec("resnet50", (1,), {"image_size": 32}),
    "mobilenet_v2": ModelSpec("mobilenet_v2", (1,), {"image_size": 32}),
    "bert_base": ModelSpec("bert_base", (1,), {"seq_len": 16, "num_hidden_layers": 1}),
    "resnet18": ModelSpec("resnet18", (1,), {"image_size": 32}),
}
FULL_DEFAULT = ("resnet50", "mobilenet_v2", "bert_base")
QUICK_DEFAULT = ("resnet18", "bert_base")


@dataclass(frozen=True)
class Settings:
    calibration_batches: int
    layer_blocks: int       # per-layer timing: blocks per provider
    layer_block_s: float    # short blocks: a block that no other process disturbed is likelier
    ref_blocks: int         # the 1-thread reference of a multi-thread layer timing (0: none)
    retries: int            # re-measurements of a multi-thread layer timing that looks contended
    confirm_blocks: int     # extra blocks for a layer whose rule/tuned choice looks slow
    model_blocks: int       # whole-model timing
    model_block_s: float
    model_budget_s: float   # per candidate; after it, a candidate stops at model_min_blocks blocks
    model_min_blocks: int
    tune_again: bool        # a second tune run (do tuned choices flip?) and, if the hint differs, one at the real batch


FULL = Settings(calibration_batches=2, layer_blocks=21, layer_block_s=0.001, ref_blocks=11, retries=3,
                confirm_blocks=30, model_blocks=61, model_block_s=0.001, model_budget_s=25.0, model_min_blocks=9,
                tune_again=True)
QUICK = Settings(calibration_batches=1, layer_blocks=7, layer_block_s=0.001, ref_blocks=0, retries=0,
                 confirm_blocks=0, model_blocks=5, model_block_s=0.005, model_budget_s=1.0, model_min_blocks=3,
                 tune_again=False)


def progress(msg: str) -> None:
    print(f"[dispatch] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# building the models

@contextlib.contextmanager
def forced_provider(name: str | None):
    """QBACKEND_PROVIDER=name around a convert (the router reads it at route time)."""
    old = os.environ.get(ENV_PROVIDER)
    if name is None:
        os.environ.pop(ENV_PROVIDER, None)
    else:
        os.environ[ENV_PROVIDER] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_PROVIDER, None)
        else:
            os.environ[ENV_PROVIDER] = old


def build_case(spec: ModelSpec, batch: int, cfg: Settings):
    return MODELS[spec.name](batch_size=batch, num_calibration_batches=cfg.calibration_batches, num_eval_batches=1,
                             **spec.kwargs)


@dataclass
class Converted:
    models: dict            # variant -> QuantizedModel
    seconds: dict           # variant -> convert time
    hint_batch: int         # the batch the layers were recorded (routed, packed, tuned) with


def libraries_exact_8bit() -> bool:
    """Whether FBGEMM and oneDNN multiply full-range 8-bit activations exactly here (VNNI)."""
    from qbackend.ops import PROVIDERS
    return all(PROVIDERS[p].exact_8bit("linear", {"m": 1, "k": 64, "n": 64}) for p in PROVIDERS)


def config() -> qbackend.QuantConfig:
    """The default config where every provider multiplies 8-bit activations exactly; without VNNI,
    7-bit activations for every layer and no per-token inputs (whose rows take 8 bits wherever a
    provider is exact), so that every all-<provider> model has the same layers and can be built."""
    if libraries_exact_8bit():
        return qbackend.QuantConfig()
    return qbackend.QuantConfig(activation=qbackend.ObserverSpec("best_range", {"dtype": torch.uint8,
                                                                                "reduce_range": True}),
                                per_token_inputs=False)


def convert_all(case, batch: int, tmpdir: str, tune_again: bool) -> Converted:
    t0 = time.perf_counter()
    prepared = qbackend.prepare(case.model, case.example_inputs, config=config())
    qbackend.calibrate(prepared, case.calibration)
    seconds = {"prepare+calibrate": time.perf_counter() - t0}
    models = {}

    def timed(variant, fn):
        t = time.perf_counter()
        models[variant] = fn()
        seconds[variant] = time.perf_counter() - t

    with forced_provider(None):
        timed("rules", lambda: qbackend.convert(prepared))
        for i, variant in enumerate(("tuned", "tuned (2nd run)")[:2 if tune_again else 1]):
            cache = TuneCache(os.path.join(tmpdir, f"tune-{batch}-{i}.json"))
            timed(variant, lambda: qbackend.convert(prepared, tune=True, tune_cache=cache))
    for p in PROVIDERS:
        with forced_provider(p):
            timed(f"all-{p}", lambda: qbackend.convert(prepared))
    first = next(i for i in models["rules"].qbackend_layers.values() if i.kind in GEMM_KINDS)
    hint = int(first.x_shape[0])
    if hint != batch and tune_again:
        with forced_provider(None):
            cache = TuneCache(os.path.join(tmpdir, f"tune-{batch}-real.json"))
            timed("tuned@real", lambda: qbackend.convert(prepared, tune=True, tune_batch_sizes=(batch,),
                                                          tune_cache=cache))
    return Converted(models, seconds, hint)


# The layers the GEMM providers run (embedding tables, BERT's word embeddings, have their own providers
# and are routed the same way in every variant).
GEMM_KINDS = ("linear", "conv2d")


def provider_of(module) -> str:
    return module.packed.provider_name


def capture_inputs(qmodel, inputs: tuple) -> dict[str, tuple]:
    """Each quantized layer's positional inputs on one run of qmodel (the first call of each)."""
    seen: dict[str, tuple] = {}
    handles = []
    for name in qmodel.qbackend_layers:
        def hook(module, args, name=name):
            if name not in seen:
                seen[name] = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        handles.append(qmodel.layer(name).register_forward_pre_hook(hook))
    try:
        qmodel(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


# ---------------------------------------------------------------------------------------------
# per layer

def real_shape_key(info: dict, args: tuple) -> dict:
    """The shape key the rule table would see for the layer's real input."""
    x = args[0]
    s = dict(info.shape)
    if info.kind == "linear":
        s["m"] = math.prod(x.shape[:-1])
    else:
        s.update(n=x.shape[0], c_in=x.shape[1], h=x.shape[2], w=x.shape[3])
    return s


def fmt_shape(info: dict, s: dict) -> str:
    if info.kind == "linear":
        return f"M={s['m']} K={s['k']} N={s['n']}"
    k = "x".join(map(str, s["kernel"]))
    st = s["stride"][0] if isinstance(s["stride"], (list, tuple)) else s["stride"]
    g = f" g={s['groups']}" if s["groups"] > 1 else ""
    return f"{s['n']}x{s['c_in']}x{s['h']}x{s['w']} -> {s['c_out']} {k}/s{st}{g}"


def fused(info: dict) -> str:
    parts = (["+res"] if info.residual else []) + \
        ([info.post_op] if info.post_op != "none" else [])
    out = "u8" if info.output == "int8" else "f32"
    return (" ".join(parts) or "-") + f" -> {out}"


_TUNER_TIME = re.compile(r"(native|fbgemm|onednn) ([0-9.]+) us")


def tuner_times(why: str) -> dict[str, float]:
    """The tuner's own times (first batch) from a tuned layer's `why`."""
    return {p: float(t) for p, t in _TUNER_TIME.findall(why.split(";")[0])}


@dataclass
class LayerRow:
    name: str
    kind: str
    shape: str
    fused: str
    t: dict[str, Timing]                 # provider -> timing at the benchmark's thread count (refused: absent)
    t1: dict[str, Timing] | None         # the same at 1 thread (the contention reference), or None
    choices: dict[str, str]              # variant -> provider it runs
    rule_real: str                       # the rule table's choice at the real input shape
    tuner: dict[str, float]              # tuner's own times (first tune run)
    refused: dict[str, str]              # provider -> why it is not in t
    contended: bool = False              # still disturbed after the retries: not judged
    reorders: object = ""
    confirmed: bool = False

    def tmin(self, p: str) -> float:
        return self.t[p].min_us if p in self.t else float("nan")

    def med(self, p: str) -> float:
        return self.t[p].median_us if p in self.t else float("nan")

    @property
    def best(self) -> str:
        return min(self.t, key=lambda p: self.t[p].min_us)

    def ratio(self, provider: str) -> float:
        """provider's time over the fastest provider's (minima over blocks)."""
        if provider not in self.t:
            return float("nan")
        return self.t[provider].min_us / self.t[self.best].min_us

    def med_ratio(self, provider: str) -> float:
        """The same on medians over blocks."""
        best = min(t.median_us for t in self.t.values())
        return self.t[provider].median_us / best if provider in self.t else float("nan")


def contended(t: dict[str, Timing], t1: dict[str, Timing] | None) -> bool:
    """A multi-thread timing other processes evidently disturbed in every block: a candidate's best
    block slower than 1.5x its own 1-thread best (+20 us). With OpenMP, one preempted thread stalls
    the whole call at the next barrier; on a busy 2-CPU machine such calls take a scheduler quantum
    (4-16 ms) instead of tens of microseconds (as benchmarks/int8_kernels.py)."""
    return t1 is not None and any(k in t and t[k].min_us > 1.5 * v.min_us + 20 for k, v in t1.items())


@contextlib.contextmanager
def num_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def time_layer(cands: dict, cfg: Settings, blocks: int | None = None) -> dict[str, Timing]:
    return measure(cands, blocks=blocks or cfg.layer_blocks, block_s=cfg.layer_block_s, warmup_s=0.02, min_warmup=2)


def bench_layers(conv: Converted, inputs: dict[str, tuple], cfg: Settings, isa_class: str, threads: int,
                 count_reorders: bool) -> list[LayerRow]:
    rules = conv.models["rules"]
    rows = []
    names = [n for n, i in rules.qbackend_layers.items() if i.kind in GEMM_KINDS]  # not embedding tables
    for i, name in enumerate(names):
        info = rules.qbackend_layers[name]
        args = inputs.get(name)
        if args is None:  # not run on this input (should not happen for these models)
            continue
        mods, refused = {}, {}
        for p in PROVIDERS:
            m = conv.models[f"all-{p}"].layer(name)
            if provider_of(m) == p:
                mods[p] = m
            else:
                refused[p] = conv.models[f"all-{p}"].qbackend_layers[name].why
        cands = {p: (lambda m=m: m(*args)) for p, m in mods.items()}
        t = time_layer(cands, cfg)
        t1 = None
        if threads > 1 and cfg.ref_blocks:
            with num_threads(1):
                t1 = time_layer(cands, cfg, cfg.ref_blocks)
            tries = 0
            while contended(t, t1) and tries < cfg.retries:
                tries += 1
                time.sleep(0.5 * tries)
                again = time_layer(cands, cfg)
                t = {p: t[p].merged(again[p]) for p in t}
        choices = {v: provider_of(q.layer(name)) for v, q in conv.models.items() if not v.startswith("all-")}
        real = real_shape_key(info, args)
        row = LayerRow(name, info.kind, fmt_shape(info, real), fused(info), t, t1, choices,
                       choose(info.kind, isa_class, real).provider,
                       tuner_times(conv.models["tuned"].qbackend_layers[name].why), refused)
        # re-measure a layer whose rule or tuned choice looks slow (or close to its target)
        slow = any(row.ratio(row.choices[v]) > lim - 0.03 for v, lim in (("rules", RULE_TARGET),
                                                                         ("tuned", TUNE_TARGET)))
        if cfg.confirm_blocks and slow and len(t) > 1:
            again = time_layer(cands, cfg, cfg.confirm_blocks)
            row.t = {p: row.t[p].merged(again[p]) for p in row.t}
            row.confirmed = True
        row.contended = contended(row.t, t1)
        if count_reorders and "onednn" in mods:
            row.reorders = onednn_reorders(cands["onednn"])
        rows.append(row)
        progress(f"  layer {i + 1}/{len(names)} {name}: " + ", ".join(f"{p} {row.t.get(p, '-')}" for p in PROVIDERS)
                 + f" us (min / median); rules {row.choices['rules']}, tuned "
                 f"{row.choices['tuned']}" + (" [contended]" if row.contended else ""))
    return rows


def geomean(xs) -> float:
    xs = [x for x in xs if x == x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fr(r: float) -> str:
    return "n/a" if r != r else f"{r:.2f}"


def layer_table(rep: Report, rows: list[LayerRow], has_real: bool, reorders: bool) -> None:
    one = any(r.t1 for r in rows)
    header = ["#", "layer", "op", "shape (real input)", "fused -> out"] + [f"{p} us" for p in PROVIDERS]
    header += [f"1 thread: {' / '.join(PROVIDERS)} (min)"] if one else []
    header += ["fastest", "rules", "rules/best", "tuned", "tuned/best", "tuner's fastest", "tuned 2nd run"]
    if has_real:
        header += ["tuned@real", "@real/best"]
    header += ["rule @ real shape"]
    if reorders:
        header += ["dn reorders"]
    rep("| " + " | ".join(header) + " |")
    rep("|" + "|".join("---" for _ in header) + "|")
    for i, r in enumerate(rows):
        def mark(v, lim):
            p = r.choices[v]
            x = r.ratio(p)
            return p, (f"**{fr(x)}**" if x > lim and not r.contended else fr(x))
        rp, rr = mark("rules", RULE_TARGET)
        tp, tr = mark("tuned", TUNE_TARGET)
        tt = r.tuner
        tuner = (f"{min(tt, key=tt.get)} ({fr(max(tt.values()) / min(tt.values()))}x)"
                 if len(tt) > 1 and min(tt.values()) > 0 else "-")
        second = r.choices.get("tuned (2nd run)", "-")
        flags = (" †" if r.confirmed else "") + (" ‡" if r.contended else "")
        cells = [str(i + 1), r.name + flags, r.kind, r.shape, r.fused] + [
            str(r.t[p]) if p in r.t else "refused" for p in PROVIDERS]
        if one:
            cells += [" / ".join(fmt_us(r.t1[p].min_us) if r.t1 and p in r.t1 else "-" for p in PROVIDERS)]
        cells += [f"{r.best} ({fr(max(r.ratio(p) for p in r.t))}x)" if len(r.t) > 1 else r.best,
                  rp, rr, tp, tr, tuner, second if second not in (tp, "-") else ("same" if second == tp else "-")]
        if has_real:
            cells += list(mark("tuned@real", TUNE_TARGET))
        cells += [r.rule_real if r.rule_real != rp else "same"]
        if reorders:
            cells += [str(r.reorders)]
        rep("| " + " | ".join(cells) + " |")
    rep()


@dataclass
class LayerSummary:
    variant: str
    target: float
    worst: float
    worst_layer: str
    geo: float
    over: list                 # (row, ratio)
    time_ratio: float          # sum of chosen minima / sum of fastest minima
    judged: int                # layers not contended
    med_over: int              # layers over the target on medians


def summarize(rows: list[LayerRow], variant: str, target: float) -> LayerSummary:
    judged = [r for r in rows if variant in r.choices and not r.contended]
    ratios = [(r, r.ratio(r.choices[variant])) for r in judged]
    if not ratios:
        return LayerSummary(variant, target, float("nan"), "-", float("nan"), [], float("nan"), 0, 0)
    worst_row, worst = max(ratios, key=lambda rr: rr[1])
    chosen = sum(r.tmin(r.choices[variant]) for r, _ in ratios)
    fastest = sum(r.tmin(r.best) for r, _ in ratios)
    return LayerSummary(variant, target, worst, worst_row.name, geomean(x for _, x in ratios),
                        [(r, x) for r, x in ratios if x > target], chosen / fastest, len(judged),
                        sum(1 for r in judged if r.med_ratio(r.choices[variant]) > target))


def summarize_1thread(rows: list[LayerRow], variant: str, target: float) -> LayerSummary | None:
    """The same on the 1-thread minima (every layer judged; no medians: the reference is short)."""
    judged = [r for r in rows if variant in r.choices and r.t1 and r.choices[variant] in r.t1]
    if not judged:
        return None

    def ratio(r):
        return r.t1[r.choices[variant]].min_us / min(t.min_us for t in r.t1.values())
    ratios = [(r, ratio(r)) for r in judged]
    worst_row, worst = max(ratios, key=lambda rr: rr[1])
    chosen = sum(r.t1[r.choices[variant]].min_us for r in judged)
    fastest = sum(min(t.min_us for t in r.t1.values()) for r in judged)
    return LayerSummary(f"{variant}, 1 thread", target, worst, worst_row.name, geomean(x for _, x in ratios),
                        [(r, x) for r, x in ratios if x > target], chosen / fastest, len(judged), -1)


# ---------------------------------------------------------------------------------------------
# whole model

MODEL_VARIANTS = ("rules", "tuned") + FIXED


def bench_models(conv: Converted, fp32_model, inputs: tuple, cfg: Settings) -> dict[str, Timing]:
    """The whole models, interleaved (fp32_model None: the int8 ones only)."""
    cands = {v: (lambda q=conv.models[v]: q(*inputs)) for v in MODEL_VARIANTS}
    if fp32_model is not None:
        cands["fp32 eager"] = lambda: fp32_model(*inputs)
    return measure(cands, blocks=cfg.model_blocks, block_s=cfg.model_block_s, warmup_s=0.2, min_warmup=2,
                   budget_s=cfg.model_budget_s, min_blocks=cfg.model_min_blocks)


def paired_ratio(t: dict[str, Timing], variant: str) -> float:
    """Median over rounds of variant / the fastest all-<provider> model within the same round."""
    a = t[variant].samples
    fixed = [t[v].samples for v in FIXED]
    n = min(len(a), *(len(f) for f in fixed))
    return statistics.median(a[i] / min(f[i] for f in fixed) for i in range(n))


def cpu_view(t: dict[str, Timing]) -> dict[str, Timing]:
    """The same timings with process CPU time in place of wall time."""
    return {v: Timing(tm.cpu_samples, tm.cpu_samples, tm.reps) for v, tm in t.items()}


@dataclass
class ModelRatios:
    on_min: dict[str, float]
    on_median: dict[str, float]
    paired: dict[str, float]


def model_table(rep: Report, t: dict[str, Timing], layer_sum_us: dict[str, float],
                differ: dict[str, str]) -> ModelRatios:
    base_min = min(t[v].min_us for v in FIXED)
    base_med = min(t[v].median_us for v in FIXED)
    rep(f"| model | ms (min / median) | blocks | / {BASE} on minima | on medians | "
        "paired per round | layers on another provider than rules | its judged layers' sum, ms (share of the "
        "model's min) |")
    rep("|---|---|---|---|---|---|---|---|")
    out = ModelRatios({}, {}, {})
    for v, tm in t.items():
        out.on_min[v] = tm.min_us / base_min
        out.on_median[v] = tm.median_us / base_med
        if v in MODEL_VARIANTS:
            out.paired[v] = paired_ratio(t, v)
        ls = layer_sum_us.get(v)
        share = f"{ls / 1e3:.2f} ({ls / tm.min_us:.0%})" if ls is not None else "-"
        rep(f"| {v} | {tm.min_us / 1e3:.2f} / {tm.median_us / 1e3:.2f} | {tm.blocks} | {fr(out.on_min[v])} | "
            f"{fr(out.on_median[v])} | {fr(out.paired[v]) if v in out.paired else '-'} | {differ.get(v, '-')} | "
            f"{share} |")
    rep()
    return out


# ---------------------------------------------------------------------------------------------

@dataclass
class CaseResult:
    label: str
    threads: int
    n_layers: int
    summaries: dict[str, LayerSummary]
    flips: list | None
    model: ModelRatios
    model1: ModelRatios | None  # 1 thread, process CPU time
    rule_real_diff: list
    hint_batch: int
    batch: int
    contended: int


def run_case(rep: Report, spec: ModelSpec, batch: int, threads: int, cfg: Settings, isa_class: str,
             reorders: bool, tmpdir: str) -> CaseResult:
    label = spec.label(batch)
    progress(f"{label}, {threads} threads: building the case")
    t0 = time.perf_counter()
    load0 = load_average()
    case = build_case(spec, batch, cfg)
    conv = convert_all(case, batch, tmpdir, cfg.tune_again)
    inputs = case.evaluation[0]
    with torch.inference_mode():
        captured = capture_inputs(conv.models["rules"], inputs)
        progress(f"{label}: {len(captured)} layers; timing each provider per layer")
        rows = bench_layers(conv, captured, cfg, isa_class, threads, reorders)
        progress(f"{label}: whole models")
        t = bench_models(conv, case.model, inputs, cfg)
        t1m = None
        if threads > 1 and cfg.ref_blocks:
            progress(f"{label}: whole int8 models at 1 thread")
            with num_threads(1):
                t1m = cpu_view(bench_models(conv, None, inputs, cfg))
    has_real = "tuned@real" in conv.models

    rep(f"### {label}, {threads} thread{'s' if threads > 1 else ''}")
    rep()
    rep(f"- load average at start: {load0}; at the end: {load_average()}")
    rep("- build (s): " + ", ".join(f"{k} {v:.1f}" for k, v in conv.seconds.items()))
    if conv.hint_batch != batch:
        rep(f"- **the layers were recorded with batch {conv.hint_batch}, not {batch}**: torch.export (`Dim.AUTO`) "
            f"gives a size-1 dimension the hint {conv.hint_batch}, and qbackend routes, prepacks (oneDNN's "
            f"input-shape hint) and tunes with the hint. Column 'tuned@real' is "
            f"`convert(tune=True, tune_batch_sizes=({batch},))`; 'rule @ real shape' is the rule table's choice "
            f"for the real input shape where it differs from what convert chose.")
    rep()
    layer_table(rep, rows, has_real, reorders)
    summaries = {v: summarize(rows, v, lim) for v, lim in (("rules", RULE_TARGET), ("tuned", TUNE_TARGET))}
    if has_real:
        summaries["tuned@real"] = summarize(rows, "tuned@real", TUNE_TARGET)
    for v, lim in (("rules", RULE_TARGET), ("tuned", TUNE_TARGET)):
        s1 = summarize_1thread(rows, v, lim)
        if s1 is not None:
            summaries[s1.variant] = s1
    n_cont = sum(1 for r in rows if r.contended)
    rep("| choice | target | worst (layer) | geometric mean | layers over target (on medians) | sum of its layers / "
        "sum of the fastest |")
    rep("|---|---|---|---|---|---|")
    for s in summaries.values():
        med = f" ({s.med_over})" if s.med_over >= 0 else ""
        rep(f"| {s.variant} | {s.target:.2f} | {fr(s.worst)} ({s.worst_layer}) | {s.geo:.3f} | "
            f"{len(s.over)} of {s.judged}{med} | {s.time_ratio:.3f} |")
    rep()
    if n_cont:
        rep(f"- ‡ {n_cont} layer(s) still disturbed by other processes after {cfg.retries} re-measurements "
            "(a provider's best block over 1.5x its 1-thread best): not judged")
    for s in summaries.values():
        v = s.variant.split(",")[0]
        if s.over and s.med_over >= 0:
            rep(f"- {s.variant} over {s.target:.2f}: " + "; ".join(
                f"{r.name} ({r.shape}): {r.choices[v]} {x:.2f}x ("
                + " / ".join(f"{p} {r.t.get(p, '-')}" for p in PROVIDERS)
                + f" us min / median; {r.med_ratio(r.choices[v]):.2f}x on medians)"
                for r, x in s.over))
        elif s.over:
            rep(f"- {s.variant} over {s.target:.2f}: " + "; ".join(
                f"{r.name} ({r.shape}): {r.choices[v]} {x:.2f}x ({' / '.join(PROVIDERS)} "
                + " / ".join(fmt_us(r.t1[p].min_us) if p in r.t1 else "-" for p in PROVIDERS) + " us)"
                for r, x in s.over))
    flips = None
    if "tuned (2nd run)" in conv.models:
        flips = [r for r in rows if r.choices["tuned"] != r.choices["tuned (2nd run)"]]
        rep(f"- tuned choices that differ between the two tune runs: {len(flips)} of {len(rows)}"
            + (": " + ", ".join(f"{r.name} ({r.choices['tuned']} / {r.choices['tuned (2nd run)']}, measured "
                                + " / ".join(f"{p} {fr(r.ratio(p))}" for p in PROVIDERS) + ")"
                                for r in flips) if flips else ""))
    rule_diff = [r for r in rows if r.rule_real != r.choices["rules"]]
    if rule_diff:
        rep(f"- layers where the rule table would choose otherwise at the real shape: {len(rule_diff)} ("
            + ", ".join(f"{r.name} -> {r.rule_real} {r.ratio(r.rule_real):.2f}x" for r in rule_diff) + ")")
    rep()
    judged = [r for r in rows if not r.contended]
    layer_sum = {v: sum(r.tmin(r.choices[v]) for r in judged) for v in ("rules", "tuned")}
    differ = {"rules": "0", "tuned": str(sum(1 for r in rows if r.choices["tuned"] != r.choices["rules"]))}
    for p in PROVIDERS:  # where p refuses a layer, its all-p model runs the rule table's choice there
        layer_sum[f"all-{p}"] = sum(r.tmin(p) if p in r.t else r.tmin(r.choices["rules"]) for r in judged)
        differ[f"all-{p}"] = str(sum(1 for r in rows if r.choices["rules"] != p and p in r.t))
    if n_cont:
        rep(f"(Layer sums leave out the {n_cont} layer(s) marked ‡. Where a model runs the same providers as "
            "'rules' on every layer, its ratio to 'rules' shows this run's noise.)")
    else:
        rep("(Where a model runs the same providers as 'rules' on every layer, its ratio to 'rules' shows this "
            "run's noise.)")
    rep()
    ratios = model_table(rep, t, layer_sum, differ)
    ratios1 = None
    if t1m is not None:
        rep("The int8 models again at 1 thread, on **process CPU time** (the time this process actually ran: "
            "insensitive to being descheduled, the noise that dominates 2-thread wall times here; 'tuned' keeps "
            "its 2-thread choices); layer sums from the 1-thread layer minima:")
        rep()
        sum1 = {v: sum(r.t1[r.choices[v]].min_us for r in rows if r.t1 and r.choices[v] in r.t1)
                for v in ("rules", "tuned")}
        for p in PROVIDERS:
            sum1[f"all-{p}"] = sum(r.t1[p].min_us if p in r.t1 else r.t1[r.choices["rules"]].min_us
                                   for r in rows if r.t1 and (p in r.t1 or r.choices["rules"] in r.t1))
        ratios1 = model_table(rep, t1m, sum1, differ)
    rep(f"_{label}: {time.perf_counter() - t0:.0f} s_")
    rep()
    res = CaseResult(label, threads, len(rows), summaries, flips, ratios, ratios1, rule_diff, conv.hint_batch, batch,
                     n_cont)
    del conv, captured, case
    gc.collect()
    return res


def header(rep: Report, threads: list[int], quick: bool, cfg: Settings, specs: list[ModelSpec]) -> str:
    rep("# qbackend dispatch benchmark: rule table and tune mode against each provider, per layer and per model")
    rep()
    rep("`python benchmarks/dispatch.py" + (" --quick" if quick else "") + "`")
    rep()
    for line in run_lines(threads):
        rep(line)
    rep("- models: " + "; ".join(f"{s.name} (batches {', '.join(map(str, s.batches))}; "
                                 + ", ".join(f"{k}={v}" for k, v in s.kwargs.items()) + ")" for s in specs)
        + "; random-init weights (`qbackend.models`), "
        + ("default QuantConfig" if libraries_exact_8bit() else "**7-bit activations, no per-token inputs** (no VNNI "
           "here: FBGEMM and oneDNN saturate 8-bit ones, so every provider is compared on 7-bit inputs)") + ", calibrated on "
        + f"{cfg.calibration_batches} batch{'es' if cfg.calibration_batches > 1 else ''}, timed on a held-out batch")
    rep(f"- per layer: the layer's module from each all-<provider> model ({', '.join(FIXED)}; same qparams; each "
        f"provider's own packed weight), called on the layer's real inputs (captured from the rule-table model), "
        f"interleaved: {cfg.layer_blocks} blocks of about {cfg.layer_block_s * 1e3:g} ms (at least one call) per "
        f"provider"
        + (f"; with several threads also {cfg.ref_blocks} blocks at 1 thread, and up to {cfg.retries} "
           f"re-measurements (merged) while a provider's best block is over 1.5x its 1-thread best + 20 us "
           f"(OpenMP calls stalled by other processes; ‡ = still so, not judged)" if cfg.ref_blocks else "")
        + (f"; {cfg.confirm_blocks} more blocks (merged; † in the table) when the rule choice is over "
           f"{RULE_TARGET - 0.03:.2f}x or the tuned one over {TUNE_TARGET - 0.03:.2f}x" if cfg.confirm_blocks else "")
        + ". Times are us per call, min / median over blocks, including the module's Python wrapper. **Ratios use "
          "the minima** (the least disturbed block; on this shared machine medians of multi-thread calls are "
          "often scheduler quanta), the summaries also count layers over target on medians. "
          f"**bold** = over the target ({RULE_TARGET:.2f} rules, {TUNE_TARGET:.2f} tuned). \"tuner's fastest\" is "
          "the provider the tuner measured fastest (first tune run, its own timing on random inputs in the layer's "
          "range) and its slowest/fastest ratio, 'tuned 2nd run' the second tune run's choice where it differs. "
          "A provider that cannot run a layer (native: 3x3 and depthwise convs) is 'refused' there; its "
          "all-<provider> model runs the rule table's choice on that layer.")
    rep(f"- whole model: rule-table, tuned, {', '.join(FIXED)} and FP32 eager, interleaved on the same batch, "
        f"{cfg.model_blocks} blocks of >= {cfg.model_block_s * 1e3:g} ms (at least one call; a candidate stops "
        f"at {cfg.model_min_blocks} blocks once it has spent {cfg.model_budget_s:g} s); ratios on minima, on "
        "medians, and 'paired per round' (median over rounds of the ratio within the round); with several "
        "threads the int8 models are timed again at 1 thread on process CPU time. "
        "Run under `torch.inference_mode()`. Nothing is asserted; the machine is shared: trust ratios within a "
        "row more than absolute times." + (" **--quick: tiny sizes and few iterations, a smoke test only.**"
                                           if quick else ""))
    rep()
    return qbackend.cpu_features().isa_class


def final_summary(rep: Report, results: list[CaseResult]) -> list[str]:
    lines: list[str] = []
    out = lines.append
    out("## Summary")
    out("")
    out(f"Per case: the worst and geometric-mean per-layer ratio of the rule table's and of tune mode's choice to "
        f"the fastest provider (minima), the layers over the target ({RULE_TARGET:.2f} / {TUNE_TARGET:.2f}; on "
        "medians in brackets), tuned choices that flipped between two tune runs, layers not judged (‡), and each "
        f"model's latency over {BASE}: paired per round (on minima in brackets), and at 1 "
        "thread on process CPU time, paired per round.")
    out("")
    cols = " | ".join(MODEL_VARIANTS[1:])
    out("| case | threads | layers | rules worst | rules geomean | rules over 1.10 | tuned worst | tuned geomean | "
        "tuned over 1.05 | tuned@real over 1.05 | tune flips | not judged | 1 thread: rules over 1.10 (worst) | "
        f"tuned over 1.05 (worst) | model: rules | {cols} | FP32 eager | 1 thread CPU: rules | {cols} |")
    out("|" + "---|" * (15 + 2 * len(MODEL_VARIANTS)))
    for c in results:
        ru, tu, tr = c.summaries["rules"], c.summaries["tuned"], c.summaries.get("tuned@real")
        trs = f"{len(tr.over)} ({tr.med_over}), worst {fr(tr.worst)}" if tr else "-"
        m, m1 = c.model, c.model1
        one = " | ".join(f"{m1.paired[v]:.3f}" for v in MODEL_VARIANTS) if m1 else " | ".join("-" * len(MODEL_VARIANTS))
        r1, t1 = c.summaries.get("rules, 1 thread"), c.summaries.get("tuned, 1 thread")
        lay1 = " | ".join(f"{len(x.over)} ({fr(x.worst)})" if x else "-" for x in (r1, t1))
        out(f"| {c.label} | {c.threads} | {c.n_layers} | {fr(ru.worst)} | {ru.geo:.3f} | {len(ru.over)} "
            f"({ru.med_over}) | {fr(tu.worst)} | {tu.geo:.3f} | {len(tu.over)} ({tu.med_over}) | {trs} | "
            f"{len(c.flips) if c.flips is not None else '-'} | {c.contended} | {lay1} | "
            + " | ".join(f"{m.paired[v]:.3f} ({m.on_min[v]:.3f})" for v in MODEL_VARIANTS)
            + f" | {m.on_min['fp32 eager']:.2f} | {one} |")
    out("")
    n_rules = sum(len(c.summaries["rules"].over) for c in results)
    n_tuned = sum(len(c.summaries["tuned"].over) for c in results)
    out(f"- rule-table choice within {RULE_TARGET:.2f}x of the fastest provider on every judged layer: "
        + ("yes" if n_rules == 0 else f"no, {n_rules} layer(s) over (listed per case)"))
    out(f"- tuned choice within {TUNE_TARGET:.2f}x on every judged layer: "
        + ("yes" if n_tuned == 0 else f"no, {n_tuned} layer(s) over (listed per case)"))
    one = [c for c in results if "rules, 1 thread" in c.summaries]
    if one:
        n1 = sum(len(c.summaries["rules, 1 thread"].over) for c in one)
        t1 = sum(len(c.summaries["tuned, 1 thread"].over) for c in one)
        out(f"- the same on the 1-thread layer minima: rule table {n1} layer(s) over {RULE_TARGET:.2f}, tuned "
            f"{t1} over {TUNE_TARGET:.2f} (tuned at the run's thread count)")
    for what, get in (("paired per round, threads as run", lambda c: c.model.paired),
                      ("on minima, threads as run", lambda c: c.model.on_min),
                      ("1 thread, process CPU time, paired per round",
                       lambda c: c.model1.paired if c.model1 else None)):
        vals = [(c.label, v, get(c)[v]) for c in results if get(c) for v in ("rules", "tuned")]
        if vals:
            label, v, worst = max(vals, key=lambda x: x[2])
            out(f"- whole model at most {BASE}, {what}: worst {worst:.3f} ({v}, {label})"
                + (" (yes)" if worst <= 1.0 else ""))
    out("")
    for line in lines:
        rep(line)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few iterations (CI smoke test, < 60 s)")
    ap.add_argument("--models", help="comma-separated among " + ", ".join(FULL_MODELS)
                    + f" (default {','.join(FULL_DEFAULT)}; --quick: {','.join(QUICK_DEFAULT)})")
    ap.add_argument("--batches", help="comma-separated batch sizes for every model (default: 1,32 for the image "
                                      "models, 1,8 for BERT; --quick: 1)")
    ap.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    ap.add_argument("--reorders", action="store_true",
                    help="also count oneDNN reorders per call of each layer's oneDNN module (ONEDNN verbose)")
    ap.add_argument("--out", help="also write the markdown to this file (the summary right after the header)")
    args = ap.parse_args(argv)
    table = QUICK_MODELS if args.quick else FULL_MODELS
    names = [m.strip() for m in (args.models or ",".join(QUICK_DEFAULT if args.quick else FULL_DEFAULT)).split(",")
             if m.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose among {', '.join(table)}")
    specs = [table[n] for n in names]
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
        specs = [ModelSpec(s.name, batches, s.kwargs) for s in specs]
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    cfg = QUICK if args.quick else FULL
    start = time.perf_counter()
    rep = Report()
    isa_class = header(rep, threads, args.quick, cfg, specs)
    n_header = len(rep.lines)
    results = []
    old_threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix="qbackend-dispatch-") as tmpdir:
            for n in threads:
                torch.set_num_threads(n)
                rep(f"## {n} thread{'s' if n > 1 else ''}")
                rep()
                for spec in specs:
                    for b in spec.batches:
                        results.append(run_case(rep, spec, b, n, cfg, isa_class, args.reorders, tmpdir))
    finally:
        torch.set_num_threads(old_threads)
    summary = final_summary(rep, results)
    rep(f"Total benchmark time: {time.perf_counter() - start:.0f} s; load average at the end {load_average()}.")
    if args.out:
        body = rep.lines[n_header:len(rep.lines) - len(summary) - 1]
        doc = rep.lines[:n_header] + summary + body + rep.lines[-1:]
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
