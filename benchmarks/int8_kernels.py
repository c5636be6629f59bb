#!/usr/bin/env python
"""Kernel benchmark: qbackend's int8 providers against their peers and against FP32 / BF16.

    python benchmarks/int8_kernels.py [--threads 1,2] [--quick] [--only linear|conv] [--out FILE]

Prints markdown tables (and writes them to FILE with --out):
  1. Linear, uint8 activations (full range; 7-bit on CPUs without VNNI) -> uint8 output: the fbgemm provider vs torch's own
     `quantized::linear` on the fbgemm engine (its peer), the onednn provider vs a direct
     `onednn::qlinear_pointwise` call on its own prepacked weight (its peer), FP32 and BF16
     `F.linear`; plus an fp32-output row set for 768x768.
  2. Conv2d, the distinct layer shapes of ResNet-50 and MobileNetV2, channels-last uint8 ->
     uint8: the same four int8 candidates (`quantized::conv2d` on the fbgemm engine,
     `onednn::qconv2d_pointwise`) and FP32 / BF16 channels-last `F.conv2d`, with the number of
     oneDNN reorders per call (a packed weight in the wrong format is reordered on every call);
     depthwise layers also with 7-bit activations (FBGEMM's depthwise kernel is exact only there).
  3. Per-call overhead of the wrappers on tiny layers, and `qbackend::quantize_per_tensor`; and the
     per-call cost of the converted digits CNN's and MobileNetV2's layers at batch 1 (each layer
     module called on the int8 input it gets in the model) against their multiply-adds at the
     measured VNNI peak (`--only layer_calls` runs that section alone).
  4. Targets: the worst provider/peer ratio of each pair (target <= 1.10).
  5. Under QBACKEND_ISA=avx2 (or --only avx2_exact there): the native AVX2 GEMM on full 8-bit
     activations against FBGEMM's and oneDNN's 7-bit routes, Linear and a few convs, with each
     route's SQNR against fp64 math (the evidence of the NO_VNNI rows of qbackend/dispatch/rules.py).

Times are microseconds per call, "min / median" over blocks of repeated calls, the candidates of
a row interleaved round-robin (benchmarks/_timing.py). Ratios use the minima. Nothing is
asserted: timings never set the exit code.

torch.ao-era quantized tensors (quint8/qint8, `torch.ops.quantized.*`) appear here only as the
peer; qbackend itself never uses them.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import fmt_us, measure  # noqa: E402

from _machine import load_average, run_lines  # noqa: E402
from qbackend.ops import PROVIDERS  # noqa: E402
from qbackend.ops.packed import PackedConv2dWeight, PackedLinearWeight  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402

warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
warnings.filterwarnings("ignore", category=UserWarning, module="torch")

TARGET = 1.10
PEER_PREPACK_THREADS = 3  # a thread count the measurements never use (see conv_candidates)
# Full-range uint8 activations (x in about [-6.4, 6.35]) where every provider multiplies them
# exactly; 7-bit ones (the same float range, the levels qbackend uses there) on CPU classes
# without VNNI (or QBACKEND_ISA caps without it), where FBGEMM and oneDNN saturate 8-bit products.
X_BITS = 8 if all(PROVIDERS[p].exact_8bit() for p in ("fbgemm", "onednn")) else 7
X_SCALE, X_ZP, X_MAX = (0.05, 128, 255) if X_BITS == 8 else (0.1, 64, 127)


# ---------------------------------------------------------------------------------------------
# settings

@dataclass(frozen=True)
class Settings:
    blocks: int
    block_s: float
    warmup_s: float
    min_warmup: int
    confirm_blocks: int  # extra blocks for a provider/peer pair whose ratio is over the target
    retries: int         # re-measurements of a multi-thread row that looks contended

    def run(self, cands, blocks: int | None = None):
        return measure(cands, blocks=blocks or self.blocks, block_s=self.block_s, warmup_s=self.warmup_s,
                       min_warmup=self.min_warmup)

    def confirm(self, t: dict, cands: dict, a: str, b: str) -> bool:
        """Re-measures the pair (a, b) when a/b is over the target, merging the blocks into t."""
        if not self.confirm_blocks or t[a].min_us <= TARGET * t[b].min_us:
            return False
        again = self.run({a: cands[a], b: cands[b]}, self.confirm_blocks)
        t[a], t[b] = t[a].merged(again[a]), t[b].merged(again[b])
        return True


FULL = Settings(blocks=15, block_s=0.005, warmup_s=0.03, min_warmup=2, confirm_blocks=30, retries=3)
QUICK = Settings(blocks=5, block_s=0.002, warmup_s=0.005, min_warmup=1, confirm_blocks=0, retries=0)

LINEAR_KN = [(768, 768), (768, 3072), (3072, 768), (4096, 4096)]
NATIVE_ISA = _C.native_isa()  # the ISA of qbackend's own GEMM here: "amx", "avx512_vnni", "avx2_vnni", "avx2" or ""
NATIVE = bool(NATIVE_ISA)
PROVIDER_COLUMNS = (("native",) if NATIVE else ()) + ("fbgemm", "onednn")
PEAK_SHAPE = (2048, 4096, 4096)  # M, K, N of the native GEMM's throughput row
LINEAR_M = [1, 4, 16, 64, 256, 1024]
FP32_OUT_KN = (768, 768)

# (name, C_in, C_out, H, W, k, stride, pad, groups); H, W are the layer's input size at 224x224.
RESNET50 = [
    ("r50 stem 7x7/2", 3, 64, 224, 224, 7, 2, 3, 1),
    ("r50 s1 1x1 64->64", 64, 64, 56, 56, 1, 1, 0, 1),
    ("r50 s1 3x3 64", 64, 64, 56, 56, 3, 1, 1, 1),
    ("r50 s1 1x1 64->256", 64, 256, 56, 56, 1, 1, 0, 1),  # also the stage-1 downsample (stride 1)
    ("r50 s1 1x1 256->64", 256, 64, 56, 56, 1, 1, 0, 1),
    ("r50 s2 1x1 256->128", 256, 128, 56, 56, 1, 1, 0, 1),
    ("r50 s2 3x3/2 128", 128, 128, 56, 56, 3, 2, 1, 1),
    ("r50 s2 ds 1x1/2 256->512", 256, 512, 56, 56, 1, 2, 0, 1),
    ("r50 s2 1x1 128->512", 128, 512, 28, 28, 1, 1, 0, 1),
    ("r50 s2 1x1 512->128", 512, 128, 28, 28, 1, 1, 0, 1),
    ("r50 s2 3x3 128", 128, 128, 28, 28, 3, 1, 1, 1),
    ("r50 s3 1x1 512->256", 512, 256, 28, 28, 1, 1, 0, 1),
    ("r50 s3 3x3/2 256", 256, 256, 28, 28, 3, 2, 1, 1),
    ("r50 s3 ds 1x1/2 512->1024", 512, 1024, 28, 28, 1, 2, 0, 1),
    ("r50 s3 1x1 256->1024", 256, 1024, 14, 14, 1, 1, 0, 1),
    ("r50 s3 1x1 1024->256", 1024, 256, 14, 14, 1, 1, 0, 1),
    ("r50 s3 3x3 256", 256, 256, 14, 14, 3, 1, 1, 1),
    ("r50 s4 1x1 1024->512", 1024, 512, 14, 14, 1, 1, 0, 1),
    ("r50 s4 3x3/2 512", 512, 512, 14, 14, 3, 2, 1, 1),
    ("r50 s4 ds 1x1/2 1024->2048", 1024, 2048, 14, 14, 1, 2, 0, 1),
    ("r50 s4 1x1 512->2048", 512, 2048, 7, 7, 1, 1, 0, 1),
    ("r50 s4 1x1 2048->512", 2048, 512, 7, 7, 1, 1, 0, 1),
    ("r50 s4 3x3 512", 512, 512, 7, 7, 3, 1, 1, 1),
]
MOBILENET_V2 = [
    ("mv2 stem 3x3/2", 3, 32, 224, 224, 3, 2, 1, 1),
    ("mv2 dw 32 @112", 32, 32, 112, 112, 3, 1, 1, 32),
    ("mv2 pw 32->16 @112", 32, 16, 112, 112, 1, 1, 0, 1),
    ("mv2 pw 16->96 @112", 16, 96, 112, 112, 1, 1, 0, 1),
    ("mv2 dw/2 96 @112", 96, 96, 112, 112, 3, 2, 1, 96),
    ("mv2 pw 96->24 @56", 96, 24, 56, 56, 1, 1, 0, 1),
    ("mv2 pw 24->144 @56", 24, 144, 56, 56, 1, 1, 0, 1),
    ("mv2 dw 144 @56", 144, 144, 56, 56, 3, 1, 1, 144),
    ("mv2 pw 144->24 @56", 144, 24, 56, 56, 1, 1, 0, 1),
    ("mv2 dw/2 144 @56", 144, 144, 56, 56, 3, 2, 1, 144),
    ("mv2 pw 144->32 @28", 144, 32, 28, 28, 1, 1, 0, 1),
    ("mv2 pw 32->192 @28", 32, 192, 28, 28, 1, 1, 0, 1),
    ("mv2 dw 192 @28", 192, 192, 28, 28, 3, 1, 1, 192),
    ("mv2 pw 192->32 @28", 192, 32, 28, 28, 1, 1, 0, 1),
    ("mv2 dw/2 192 @28", 192, 192, 28, 28, 3, 2, 1, 192),
    ("mv2 pw 192->64 @14", 192, 64, 14, 14, 1, 1, 0, 1),
    ("mv2 pw 64->384 @14", 64, 384, 14, 14, 1, 1, 0, 1),
    ("mv2 dw 384 @14", 384, 384, 14, 14, 3, 1, 1, 384),
    ("mv2 pw 384->64 @14", 384, 64, 14, 14, 1, 1, 0, 1),
    ("mv2 pw 384->96 @14", 384, 96, 14, 14, 1, 1, 0, 1),
    ("mv2 pw 96->576 @14", 96, 576, 14, 14, 1, 1, 0, 1),
    ("mv2 dw 576 @14", 576, 576, 14, 14, 3, 1, 1, 576),
    ("mv2 pw 576->96 @14", 576, 96, 14, 14, 1, 1, 0, 1),
    ("mv2 dw/2 576 @14", 576, 576, 14, 14, 3, 2, 1, 576),
    ("mv2 pw 576->160 @7", 576, 160, 7, 7, 1, 1, 0, 1),
    ("mv2 pw 160->960 @7", 160, 960, 7, 7, 1, 1, 0, 1),
    ("mv2 dw 960 @7", 960, 960, 7, 7, 3, 1, 1, 960),
    ("mv2 pw 960->160 @7", 960, 160, 7, 7, 1, 1, 0, 1),
    ("mv2 pw 960->320 @7", 960, 320, 7, 7, 1, 1, 0, 1),
    ("mv2 pw 320->1280 @7", 320, 1280, 7, 7, 1, 1, 0, 1),
]
CONV_LAYERS = RESNET50 + MOBILENET_V2
QUICK_CONV = ["r50 stem 7x7/2", "r50 s1 3x3 64", "r50 s3 1x1 1024->256", "mv2 dw 144 @56", "mv2 pw 96->24 @56"]


# ---------------------------------------------------------------------------------------------
# helpers

@contextlib.contextmanager
def quantized_engine(name: str):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def weight_scales(n: int, fan_in: int) -> torch.Tensor:
    # int8 weights uniform in [-127, 127] (std ~73), activations (x - zp) std ~74 x X_SCALE: this
    # keeps the fp output's std near 3.7 whatever the fan-in.
    return torch.empty(n).uniform_(0.5, 1.5) / (73.0 * math.sqrt(fan_in))


OUT_SCALE, OUT_ZP = 8 * 3.7 / 255, 128


def lsb_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.to(torch.int16) - b.to(torch.int16)).abs().max())


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def fr(r: float) -> str:
    return "n/a" if r != r else f"{r:.2f}"


class Report:
    """Collects markdown lines, echoing them to stdout as they come."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self("| " + " | ".join(header) + " |")
        self("|" + "|".join("---" for _ in header) + "|")
        for r in rows:
            self("| " + " | ".join(r) + " |")
        self()


try:
    _libc = ctypes.CDLL(None)
except OSError:  # not a POSIX libc: no reorder counts
    _libc = None


def onednn_reorders(fn) -> int | str:
    """oneDNN reorder primitives executed by one call of fn (ONEDNN verbose, captured at fd 1)."""
    if _libc is None:
        return "?"
    fn()
    sys.stdout.flush()
    _libc.fflush(None)
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                fn()
            _libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return sum(1 for line in text.splitlines() if ",exec," in line and ",reorder," in line)


def progress(msg: str) -> None:
    print(f"[kernels] {msg}", file=sys.stderr, flush=True)


@dataclass
class PeerRow:
    section: str
    threads: int
    label: str
    fb: float  # qbackend fbgemm / torch fbgemm (wall-time minima)
    dn: float  # qbackend onednn / onednn direct
    fb_cpu: float = float("nan")  # the same on process CPU time
    dn_cpu: float = float("nan")
    depthwise: bool = False
    note: str = ""
    contended: bool = False  # a multi-thread row other processes visibly disturbed (see contended())


def peer_row(section: str, threads: int, label: str, t: dict, fb=("fbgemm", "torch_fbgemm"),
             dn=("onednn", "onednn_direct"), depthwise: bool = False) -> PeerRow:
    def r(pair, attr):
        return ratio(getattr(t[pair[0]], attr), getattr(t[pair[1]], attr)) if pair else float("nan")
    return PeerRow(section, threads, label, r(fb, "min_us"), r(dn, "min_us"), r(fb, "cpu_min_us"),
                   r(dn, "cpu_min_us"), depthwise)


# ---------------------------------------------------------------------------------------------
# 1. linear

@dataclass
class LinearSetup:
    x_u8: torch.Tensor
    x_f: torch.Tensor
    x_bf: torch.Tensor
    pw_fb: PackedLinearWeight
    pw_dn: PackedLinearWeight
    pw_nt: PackedLinearWeight | None  # the native provider, where this CPU has it
    tq_x: torch.Tensor
    tq_w: object
    w_f: torch.Tensor
    w_bf: torch.Tensor
    b_f: torch.Tensor
    b_bf: torch.Tensor
    w_zp: torch.Tensor
    dn_w: torch.Tensor  # the peer's own packed weight (onednn::qlinear_prepack, same x_shape hint)


def make_linear_weight(K: int, N: int):
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8)
    ws = weight_scales(N, K)
    b = torch.empty(N).uniform_(-1, 1)
    with quantized_engine("fbgemm"):
        wq = torch._make_per_channel_quantized_tensor(w, ws.double(), torch.zeros(N, dtype=torch.long), 0)
        tq_w = torch.ops.quantized.linear_prepack(wq, b)
    w_f = w.float() * ws[:, None]
    return w, ws, b, tq_w, w_f


def make_linear(M: int, K: int, N: int, weight) -> LinearSetup:
    w, ws, b, tq_w, w_f = weight
    x_u8 = torch.randint(0, X_MAX + 1, (M, K), dtype=torch.uint8)
    x_f = (x_u8.float() - X_ZP) * X_SCALE
    return LinearSetup(
        x_u8=x_u8, x_f=x_f, x_bf=x_f.to(torch.bfloat16),
        pw_fb=PackedLinearWeight(w, ws, b, provider="fbgemm", x_shape=[M, K]),
        pw_dn=PackedLinearWeight(w, ws, b, provider="onednn", x_shape=[M, K]),
        pw_nt=PackedLinearWeight(w, ws, b, provider="native") if NATIVE else None,
        tq_x=torch._make_per_tensor_quantized_tensor(x_u8, X_SCALE, X_ZP), tq_w=tq_w,
        w_f=w_f, w_bf=w_f.to(torch.bfloat16), b_f=b, b_bf=b.to(torch.bfloat16),
        w_zp=torch.zeros(N, dtype=torch.long), dn_w=torch.ops.onednn.qlinear_prepack(w, [M, K]))


def linear_candidates(s: LinearSetup, out_dtype=torch.uint8) -> dict:
    u8 = torch.uint8
    qlinear, pointwise = torch.ops.quantized.linear, torch.ops.onednn.qlinear_pointwise
    dn_dtype = None if out_dtype == u8 else out_dtype
    native = {"native": lambda: s.pw_nt.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, out_dtype)} if NATIVE else {}
    return {
        **native,
        "fbgemm": lambda: s.pw_fb.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, out_dtype),
        "torch_fbgemm": lambda: qlinear(s.tq_x, s.tq_w, OUT_SCALE, OUT_ZP),
        "onednn": lambda: s.pw_dn.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, out_dtype),
        "onednn_direct": lambda: pointwise(s.x_u8, X_SCALE, X_ZP, s.dn_w, s.pw_dn.w_scales, s.w_zp,
                                           s.pw_dn.bias, OUT_SCALE if out_dtype == u8 else 1.0,
                                           OUT_ZP if out_dtype == u8 else 0, dn_dtype, "none", [], ""),
        "fp32": lambda: F.linear(s.x_f, s.w_f, s.b_f),
        "bf16": lambda: F.linear(s.x_bf, s.w_bf, s.b_bf),
    }


def contended(t: dict, t1: dict | None) -> bool:
    """A multi-thread measurement that some other process evidently disturbed: a candidate slower than
    1.5x its own 1-thread time (+20 us). With OpenMP, one preempted thread stalls the whole call at the
    next barrier, so on a busy 2-CPU machine whole rows of 2-thread times turn into scheduler quanta."""
    return t1 is not None and any(k in t and t[k].min_us > 1.5 * v.min_us + 20 for k, v in t1.items())


def measure_row(cfg: Settings, cands: dict, n: int, t1: dict | None, pairs) -> tuple[dict, bool]:
    """Measures one row at n threads, confirms the provider/peer pairs, and re-measures (merging
    blocks) up to cfg.retries times while it looks contended; returns (timings, still contended)."""
    t = cfg.run(cands)
    for a, b in pairs:
        cfg.confirm(t, cands, a, b)
    tries = 0
    while n > 1 and contended(t, t1) and tries < cfg.retries:
        tries += 1
        time.sleep(0.5 * tries)
        again = cfg.run(cands)
        t = {k: t[k].merged(again[k]) for k in t}
        for a, b in pairs:
            cfg.confirm(t, cands, a, b)
    return t, n > 1 and contended(t, t1)


def tn(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def bench_linear(rep: Report, cfg: Settings, threads: list[int], quick: bool, peers: list[PeerRow]) -> None:
    header = (["K x N", "M"] + (["qb native"] if NATIVE else []) + ["qb fbgemm", "torch fbgemm", "qb onednn",
              "onednn direct", "FP32", "BF16", "int8 GOPS"] + (["nt/best"] if NATIVE else [])
              + ["fb/peer", "dn/peer", "vs FP32", "vs BF16", "winner", "dLSB"])
    rows: dict[int, list] = {n: [] for n in threads}
    for K, N in LINEAR_KN:
        weight = make_linear_weight(K, N)
        for M in LINEAR_M:
            if quick and M == 1024 and (K, N) == (4096, 4096):
                continue
            s = make_linear(M, K, N, weight)
            cands = linear_candidates(s)
            with quantized_engine("fbgemm"):
                d_fb = lsb_diff(cands["fbgemm"](), cands["torch_fbgemm"]().int_repr())
                d_dn = lsb_diff(cands["onednn"](), cands["onednn_direct"]())
                d_nt = f" / {lsb_diff(cands['native'](), cands['torch_fbgemm']().int_repr())}" if NATIVE else ""
            t1 = None
            for n in threads:
                torch.set_num_threads(n)
                with quantized_engine("fbgemm"):
                    t, noisy = measure_row(cfg, cands, n, t1, [("fbgemm", "torch_fbgemm"), ("onednn", "onednn_direct")])
                if n == 1:
                    t1 = t
                mins = {k: v.min_us for k, v in t.items()}
                lib = min(("fbgemm", "onednn"), key=lambda k: mins[k])
                best = min(PROVIDER_COLUMNS, key=lambda k: mins[k])
                nt = [fr(ratio(mins["native"], mins[lib]))] if NATIVE else []
                pr = peer_row("linear", n, f"{K}x{N} M={M}", t)
                pr.contended = noisy
                peers.append(pr)
                rows[n].append([f"{K}x{N}", str(M) + (" †" if noisy else "")] + [str(t[k]) for k in cands]
                               + [f"{2 * M * K * N / mins[best] / 1e3:.0f}"] + nt + [fr(pr.fb), fr(pr.dn),
                                  fr(ratio(mins["fp32"], mins[best])), fr(ratio(mins["bf16"], mins[best])), best,
                                  f"{d_fb} / {d_dn}{d_nt}"])
                progress(f"linear {n}t {K}x{N} M={M}: " + ", ".join(f"{k} {fmt_us(v)}" for k, v in mins.items()))
        del weight
    rep("## Linear, uint8 -> uint8")
    rep()
    rep("Times in us, min / median over blocks. fb/peer = qbackend fbgemm / torch `quantized::linear` "
        "(fbgemm engine); dn/peer = qbackend onednn / direct `onednn::qlinear_pointwise`; "
        "nt/best = qbackend native / the faster of qbackend fbgemm and onednn (< 1: native is faster); "
        "vs FP32 / vs BF16 = speed-up of the fastest provider; int8 GOPS: of the fastest provider; "
        "dLSB = max |difference| of the u8 outputs "
        "(provider vs peer, fbgemm / onednn / native vs torch fbgemm). † = a multi-thread row still disturbed by other processes after "
        "re-measurement (some candidate over 1.5x its own 1-thread time): not judged.")
    rep()
    for n in threads:
        rep(f"### Linear, {tn(n)}")
        rep()
        rep.table(header, rows[n])

    # fp32 output for one shape
    K, N = FP32_OUT_KN
    header = ["M", "qb fbgemm u8", "qb fbgemm f32", "qb onednn u8", "qb onednn f32", "onednn direct f32",
              "fbgemm f32/u8", "onednn f32/u8", "dn f32/peer"]
    rows = {n: [] for n in threads}
    weight = make_linear_weight(K, N)
    for M in LINEAR_M:
        s = make_linear(M, K, N, weight)
        u8 = linear_candidates(s)
        f32 = linear_candidates(s, torch.float32)
        cands = {"fb_u8": u8["fbgemm"], "fb_f32": f32["fbgemm"], "dn_u8": u8["onednn"], "dn_f32": f32["onednn"],
                 "dd_f32": f32["onednn_direct"]}
        t1 = None
        for n in threads:
            torch.set_num_threads(n)
            t, noisy = measure_row(cfg, cands, n, t1, [])
            if n == 1:
                t1 = t
            m = {k: v.min_us for k, v in t.items()}
            rows[n].append([str(M) + (" †" if noisy else "")] + [str(t[k]) for k in cands]
                           + [fr(ratio(m["fb_f32"], m["fb_u8"])), fr(ratio(m["dn_f32"], m["dn_u8"])),
                              fr(ratio(m["dn_f32"], m["dd_f32"]))])
            progress(f"linear f32-out {n}t M={M}")
    rep(f"## Linear {K}x{N}: uint8 vs fp32 output")
    rep()
    rep("fbgemm fp32 output is FBGEMM's fused ReQuantizeForFloat; onednn writes fp32 directly. "
        "f32/u8 = cost of the fp32 output relative to the uint8 one; dn f32/peer = qbackend onednn fp32 "
        "vs direct `onednn::qlinear_pointwise` with output_dtype=float32.")
    rep()
    for n in threads:
        rep(f"### Linear {K}x{N} output dtype, {tn(n)}")
        rep()
        rep.table(header, rows[n])


# ---------------------------------------------------------------------------------------------
# 2. conv

def conv_candidates(layer, batch: int) -> tuple[dict, dict, bool]:
    name, C, OC, H, W, k, stride, pad, groups = layer
    cl = torch.channels_last
    x_u8 = torch.randint(0, X_MAX + 1, (batch, C, H, W), dtype=torch.uint8).contiguous(memory_format=cl)
    w = torch.randint(-127, 128, (OC, C // groups, k, k), dtype=torch.int8)
    ws = weight_scales(OC, C // groups * k * k)
    b = torch.empty(OC).uniform_(-1, 1)
    geo = dict(stride=(stride, stride), padding=(pad, pad), dilation=(1, 1), groups=groups)
    # The provider's onednn weight first, as the only prepack of this shape (as in a model), with the
    # activation qparams it runs with (x_qparams). The peer's weight is prepacked as torch's own flow
    # does it (with the real x scale / zero point), but under
    # another thread count: ideep caches the primitive descriptor that picks the weight format under a
    # key that includes omp_get_max_threads() but evidently not the source zero point, so a second
    # prepack of the same shape would get the provider's format (no zero-point compensation, which
    # oneDNN then reorders on every call). The `reorders` column checks the result.
    pw_dn = PackedConv2dWeight(w, ws, b, provider="onednn", x_shape=list(x_u8.shape), x_qparams=(X_SCALE, X_ZP),
                               **geo)
    nt = torch.get_num_threads()
    torch.set_num_threads(PEER_PREPACK_THREADS)
    try:
        dn_w = torch.ops.onednn.qconv_prepack(w, ws, X_SCALE, X_ZP, [stride] * 2, [pad] * 2, [1, 1], groups,
                                              list(x_u8.shape))
    finally:
        torch.set_num_threads(nt)
    pw_fb = PackedConv2dWeight(w, ws, b, provider="fbgemm", x_shape=list(x_u8.shape), **geo)
    with quantized_engine("fbgemm"):
        wq = torch._make_per_channel_quantized_tensor(w, ws.double(), torch.zeros(OC, dtype=torch.long), 0)
        tq_w = torch.ops.quantized.conv2d_prepack(wq, b, [stride] * 2, [pad] * 2, [1, 1], groups)
    tq_x = torch._make_per_tensor_quantized_tensor(x_u8, X_SCALE, X_ZP)
    w_zp = torch.zeros(OC, dtype=torch.long)
    x_f = ((x_u8.float() - X_ZP) * X_SCALE).contiguous(memory_format=cl)
    w_f = (w.float() * ws[:, None, None, None]).contiguous(memory_format=cl)
    x_bf, w_bf, b_bf = x_f.to(torch.bfloat16), w_f.to(torch.bfloat16), b.to(torch.bfloat16)
    u8 = torch.uint8
    qconv, pointwise = torch.ops.quantized.conv2d, torch.ops.onednn.qconv2d_pointwise
    st, pd, dl = [stride] * 2, [pad] * 2, [1, 1]
    cands = {
        "fbgemm": lambda: pw_fb.conv2d(x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
        "torch_fbgemm": lambda: qconv(tq_x, tq_w, OUT_SCALE, OUT_ZP),
        "onednn": lambda: pw_dn.conv2d(x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
        "onednn_direct": lambda: pointwise(x_u8, X_SCALE, X_ZP, dn_w, pw_dn.w_scales, w_zp, pw_dn.bias,
                                           st, pd, dl, groups, OUT_SCALE, OUT_ZP, None, "none", [], ""),
        "fp32": lambda: F.conv2d(x_f, w_f, b, stride, pad, 1, groups),
        "bf16": lambda: F.conv2d(x_bf, w_bf, b_bf, stride, pad, 1, groups),
    }
    extra = {}
    depthwise = groups == C and groups == OC and groups > 1
    if depthwise:
        # 7-bit activations: the only input on which FBGEMM's depthwise kernel is exact, so the
        # only one on which the fbgemm provider takes it (8-bit ones take its exact route).
        x7 = (x_u8 >> 1).contiguous(memory_format=cl)
        tq_x7 = torch._make_per_tensor_quantized_tensor(x7, 2 * X_SCALE, X_ZP // 2)
        extra = {
            "fbgemm_7bit": lambda: pw_fb.conv2d(x7, 2 * X_SCALE, X_ZP // 2, OUT_SCALE, OUT_ZP, u8),
            "torch_fbgemm_7bit": lambda: qconv(tq_x7, tq_w, OUT_SCALE, OUT_ZP),
        }
    return cands, extra, depthwise


def conv_gops(layer, batch: int, us: float) -> float:
    _, C, OC, H, W, k, stride, pad, groups = layer
    oh, ow = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    return 2 * batch * oh * ow * OC * (C // groups) * k * k / us / 1e3


def bench_conv(rep: Report, cfg: Settings, threads: list[int], quick: bool, batch16: str,
               peers: list[PeerRow]) -> None:
    layers = [l for l in CONV_LAYERS if l[0] in QUICK_CONV] if quick else CONV_LAYERS
    batches = [1] if quick else [1, 16]
    header = ["layer", "N", "C->OC", "HxW", "k/s/g", "qb fbgemm", "torch fbgemm", "qb onednn", "onednn direct",
              "FP32", "BF16", "int8 GOPS", "fb/peer", "dn/peer", "vs FP32", "vs BF16", "winner", "dLSB",
              "reorders"]
    rows: dict[int, list] = {n: [] for n in threads}
    dw_rows: dict[int, list] = {n: [] for n in threads}
    for batch in batches:
        for layer in layers:
            name, C, OC, H, W, k, stride, pad, groups = layer
            if batch == 16 and batch16 != "all" and not (name.startswith("r50") or name in
                                                             ("mv2 stem 3x3/2", "mv2 dw 32 @112",
                                                              "mv2 pw 32->16 @112")):
                continue
            cands, extra, depthwise = conv_candidates(layer, batch)
            allc = {**cands, **extra}
            with quantized_engine("fbgemm"):
                d_fb = lsb_diff(cands["fbgemm"](), cands["torch_fbgemm"]().int_repr())
                d_dn = lsb_diff(cands["onednn"](), cands["onednn_direct"]())
                d_7 = lsb_diff(extra["fbgemm_7bit"](), extra["torch_fbgemm_7bit"]().int_repr()) if extra else None
            reorders = f"{onednn_reorders(cands['onednn'])} / {onednn_reorders(cands['onednn_direct'])}"
            label = f"{name} N={batch}"
            pairs = ([] if depthwise else [("fbgemm", "torch_fbgemm")]) + [("onednn", "onednn_direct")] + (
                [("fbgemm_7bit", "torch_fbgemm_7bit")] if extra else [])
            t1 = None
            for n in threads:
                torch.set_num_threads(n)
                with quantized_engine("fbgemm"):
                    t, noisy = measure_row(cfg, allc, n, t1, pairs)
                if n == 1:
                    t1 = t
                m = {k_: v.min_us for k_, v in t.items()}
                best = min(("fbgemm", "onednn"), key=lambda k_: m[k_])
                pr = peer_row("conv", n, label, t, depthwise=depthwise)
                pr.note = reorders
                pr.contended = noisy
                peers.append(pr)
                rows[n].append([name, str(batch) + (" †" if noisy else ""), f"{C}->{OC}", f"{H}x{W}", f"{k}/{stride}/{groups}"]
                               + [str(t[k_]) for k_ in cands]
                               + [f"{conv_gops(layer, batch, m[best]):.0f}", fr(pr.fb), fr(pr.dn),
                                  fr(ratio(m["fp32"], m[best])), fr(ratio(m["bf16"], m[best])), best,
                                  f"{d_fb} / {d_dn}", reorders])
                if extra:
                    pr7 = peer_row("conv-dw7", n, label + " (7-bit x)", t, fb=("fbgemm_7bit", "torch_fbgemm_7bit"),
                                   dn=None, depthwise=True)
                    pr7.contended = noisy
                    peers.append(pr7)
                    dw_rows[n].append([name, str(batch), str(t["fbgemm"]), str(t["fbgemm_7bit"]),
                                       str(t["torch_fbgemm_7bit"]), str(t["onednn"]), fr(pr7.fb),
                                       fr(ratio(m["fbgemm"], m["fbgemm_7bit"])), str(d_7)])
                progress(f"conv {n}t {label}: " + ", ".join(f"{k_} {fmt_us(v)}" for k_, v in m.items()))
            del cands, extra, allc
    rep("## Conv2d, channels-last uint8 -> uint8")
    rep()
    rep("Times in us, min / median. fb/peer = qbackend fbgemm / torch `quantized::conv2d` (fbgemm engine); "
        "dn/peer = qbackend onednn / direct `onednn::qconv2d_pointwise`; k/s/g = kernel / stride / groups; "
        "dLSB = max |u8 difference| provider vs peer (fbgemm / onednn); reorders = oneDNN reorder primitives "
        "run per call (ONEDNN verbose), qbackend onednn / direct: 1 means the packed weight is reordered on "
        "every call. FP32/BF16 are plain `F.conv2d` (oneDNN reorders their weights on every call, as in eager "
        "PyTorch). Depthwise rows (g = C) with 8-bit activations: the fbgemm provider takes an exact route "
        "instead of FBGEMM's depthwise kernel, which overflows 16-bit intermediates there (hence torch's large "
        "dLSB); the 7-bit table below is the like-for-like comparison. † = disturbed multi-thread row, not judged.")
    if quick:
        rep(f"(--quick: {len(layers)} layers, batch 1 only.)")
    elif batch16 != "all":
        rep("(Batch 16 limited to the ResNet-50 layers and the MobileNetV2 stem/first layers to save time.)")
    rep()
    for n in threads:
        rep(f"### Conv2d, {tn(n)}")
        rep()
        rep.table(header, rows[n])
    if any(dw_rows.values()):
        rep("## Depthwise conv: fbgemm provider with 7-bit activations")
        rep()
        rep("With activations in [0, 127] the fbgemm provider runs FBGEMM's depthwise kernel like torch does. "
            "7-bit/peer = qbackend fbgemm (7-bit x) / torch fbgemm (7-bit x); 8-bit/7-bit = cost of the "
            "provider's exact route taken for full-range activations.")
        rep()
        for n in threads:
            rep(f"### Depthwise, {tn(n)}")
            rep()
            rep.table(["layer", "N", "qb fbgemm 8-bit x", "qb fbgemm 7-bit x", "torch fbgemm 7-bit x",
                       "qb onednn 8-bit x", "7-bit/peer", "8-bit/7-bit", "dLSB 7-bit"], dw_rows[n])


# ---------------------------------------------------------------------------------------------
# 3. overhead

def bench_overhead(rep: Report, cfg: Settings, threads: list[int], only: str | None) -> None:
    ops = torch.ops.qbackend
    u8 = torch.uint8
    sets = []  # (layer, provider, {a, b, bd, c, cd})
    if only in (None, "linear"):
        M, K, N = 1, 64, 64
        weight = make_linear_weight(K, N)
        s = make_linear(M, K, N, weight)
        fb, dn = s.pw_fb, s.pw_dn
        args_fb = (s.x_u8, X_SCALE, X_ZP, fb.packed, fb.w_scales, fb.bias, OUT_SCALE, OUT_ZP, u8, "none")
        args_dn = (s.x_u8, X_SCALE, X_ZP, dn.packed, dn.w_scales, dn.bias, OUT_SCALE, OUT_ZP, u8, "none")
        dn_peer = (s.x_u8, X_SCALE, X_ZP, dn.packed, dn.w_scales, s.w_zp, dn.bias, OUT_SCALE, OUT_ZP, None,
                   "none", [], "")
        ql, pw = torch.ops.quantized.linear, torch.ops.onednn.qlinear_pointwise
        lin = f"linear {M}x{K}x{N}"
        sets.append((lin, "fbgemm", {
            "a": lambda: fb.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
            "b": lambda: ops.fbgemm_linear(*args_fb), "bd": lambda: ops.fbgemm_linear.default(*args_fb),
            "c": lambda: ql(s.tq_x, s.tq_w, OUT_SCALE, OUT_ZP),
            "cd": lambda: ql.default(s.tq_x, s.tq_w, OUT_SCALE, OUT_ZP)}))
        sets.append((lin, "onednn", {
            "a": lambda: dn.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
            "b": lambda: ops.onednn_linear(*args_dn), "bd": lambda: ops.onednn_linear.default(*args_dn),
            "c": lambda: pw(*dn_peer), "cd": lambda: pw.default(*dn_peer)}))
        if NATIVE:
            nt = s.pw_nt
            args_nt = (s.x_u8, X_SCALE, X_ZP, nt.packed, nt.w_scales, nt.bias, OUT_SCALE, OUT_ZP, u8, "none")
            sets.append((lin, "native", {
                "a": lambda: nt.linear(s.x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
                "b": lambda: ops.native_linear(*args_nt), "bd": lambda: ops.native_linear.default(*args_nt)}))
        sets.append((lin, "FP32 F.linear", {"c": lambda: F.linear(s.x_f, s.w_f, s.b_f)}))
    if only in (None, "conv"):
        cl = torch.channels_last
        x_u8 = torch.randint(0, X_MAX + 1, (1, 16, 8, 8), dtype=torch.uint8).contiguous(memory_format=cl)
        w = torch.randint(-127, 128, (16, 16, 3, 3), dtype=torch.int8)
        ws = weight_scales(16, 16 * 9)
        b = torch.empty(16).uniform_(-1, 1)
        geo = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
        cfb = PackedConv2dWeight(w, ws, b, provider="fbgemm", x_shape=[1, 16, 8, 8], **geo)
        cdn = PackedConv2dWeight(w, ws, b, provider="onednn", x_shape=[1, 16, 8, 8], **geo)
        with quantized_engine("fbgemm"):
            wq = torch._make_per_channel_quantized_tensor(w, ws.double(), torch.zeros(16, dtype=torch.long), 0)
            tq_w = torch.ops.quantized.conv2d_prepack(wq, b, [1, 1], [1, 1], [1, 1], 1)
        tq_x = torch._make_per_tensor_quantized_tensor(x_u8, X_SCALE, X_ZP)
        w_zp = torch.zeros(16, dtype=torch.long)
        g = ([1, 1], [1, 1], [1, 1], 1)
        cargs_fb = (x_u8, X_SCALE, X_ZP, cfb.packed, cfb.w_scales, cfb.bias, *g, OUT_SCALE, OUT_ZP, u8, "none")
        cargs_dn = (x_u8, X_SCALE, X_ZP, cdn.packed, cdn.w_scales, cdn.bias, *g, OUT_SCALE, OUT_ZP, u8, "none")
        cdn_peer = (x_u8, X_SCALE, X_ZP, cdn.packed, cdn.w_scales, w_zp, cdn.bias, *g, OUT_SCALE, OUT_ZP, None,
                    "none", [], "")
        qc, pc = torch.ops.quantized.conv2d, torch.ops.onednn.qconv2d_pointwise
        conv = "conv 1x16x8x8 3x3 ->16"
        sets.append((conv, "fbgemm", {
            "a": lambda: cfb.conv2d(x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
            "b": lambda: ops.fbgemm_conv2d(*cargs_fb), "bd": lambda: ops.fbgemm_conv2d.default(*cargs_fb),
            "c": lambda: qc(tq_x, tq_w, OUT_SCALE, OUT_ZP), "cd": lambda: qc.new(tq_x, tq_w, OUT_SCALE, OUT_ZP)}))
        sets.append((conv, "onednn", {
            "a": lambda: cdn.conv2d(x_u8, X_SCALE, X_ZP, OUT_SCALE, OUT_ZP, u8),
            "b": lambda: ops.onednn_conv2d(*cargs_dn), "bd": lambda: ops.onednn_conv2d.default(*cargs_dn),
            "c": lambda: pc(*cdn_peer), "cd": lambda: pc.default(*cdn_peer)}))
    from qbackend.ops import quantize
    xq = torch.randn(1, 768)
    qcands = {"`torch.ops.qbackend.quantize_per_tensor`": lambda: ops.quantize_per_tensor(xq, X_SCALE, X_ZP, u8),
              "`torch.ops.qbackend.quantize_per_tensor.default`":
                  lambda: ops.quantize_per_tensor.default(xq, X_SCALE, X_ZP, u8),
              "`qbackend.ops.quantize` wrapper": lambda: quantize(xq, X_SCALE, X_ZP, u8),
              "`torch.quantize_per_tensor` (quint8, reference)":
                  lambda: torch.quantize_per_tensor(xq, X_SCALE, X_ZP, torch.quint8)}

    rep("## Per-call overhead")
    rep()
    rep("(a) PackedLinearWeight.linear / PackedConv2dWeight.conv2d; (b) the raw `torch.ops.qbackend.*` call "
        "with the same arguments (op packet; `.default` = the resolved overload); (c) the peer (torch "
        "`quantized::*` on the fbgemm engine, or the direct `onednn::*` call on the provider's own packed "
        "weight, so that only the per-call path differs; packet and `.default`). Overheads: (a)-(c) and "
        "(b)-(c), packet vs packet. Times in us, min / median.")
    rep()
    header = ["layer", "provider", "(a) wrapper", "(b) raw op", "(b) .default", "(c) peer", "(c) .default",
              "(a)-(c)", "(b)-(c)"]
    for n in threads:
        torch.set_num_threads(n)
        rows = []
        for layer, prov, cands in sets:
            with quantized_engine("fbgemm"):
                t = cfg.run(cands)
            cell = [str(t[k]) if k in t else "" for k in ("a", "b", "bd", "c", "cd")]
            diff = [fmt_us(t[k].min_us - t["c"].min_us) if k in t and "c" in t else "" for k in ("a", "b")]
            rows.append([layer, prov] + cell + diff)
        progress(f"overhead {n}t")
        rep(f"### Per-call overhead, {tn(n)}")
        rep()
        rep.table(header, rows)
        t = cfg.run(qcands)
        rep.table([f"quantize (1,768) fp32 -> u8, {tn(n)}", "us (min / median)"], [[k, str(v)] for k, v in t.items()])


def _layer_macs(rec, out: torch.Tensor) -> int:
    """Multiply-adds of a conv2d / linear layer that wrote `out` (0 for other kinds)."""
    sh = rec.shape
    if rec.kind == "linear":
        return out.numel() * int(sh["k"])
    if rec.kind == "conv2d":
        kh, kw = (int(v) for v in sh["kernel"])
        return out.numel() * (int(sh["c_in"]) // int(sh.get("groups", 1))) * kh * kw
    return 0


def bench_layer_calls(rep: Report, cfg: Settings, threads: list[int], quick: bool) -> None:
    """Per-call cost of the converted zoo CNNs' layers at batch 1, against each layer's multiply-adds
    at the VNNI peak measured here (`qbackend._C.native_peak_ops`: a loop of independent
    dot-product instructions). Two costs per layer: its step of the forward plan, which is what an
    eager forward runs (`qbackend.report.plan_profile`: a steady-clock read between the replay's
    steps, so no profiler inside; the step is the dispatcher call, checks, output allocation, the
    kernel and its thread fork), and the layer module called from Python on the int8 input it gets
    in the model (forward plans off: what a forward without plans pays). "above" = the step's
    minimum less the arithmetic time: a step's fixed cost plus the kernel's distance from peak."""
    if not NATIVE:
        rep("## Layer calls against the arithmetic: skipped (no native GEMM on this CPU)")
        rep()
        return
    import qbackend
    from qbackend.models import MODELS
    from qbackend.report.plan_profile import profile_plan
    models = ["digits_cnn"] + ([] if quick else ["mobilenet_v2"])
    smallest = 4 if quick else 12
    rep("## Layer calls against the arithmetic, batch 1")
    rep()
    rep("Per layer: its forward-plan step (min / median us over 300 replays of the whole plan, each step timed "
        "by a clock read between steps) and the layer module called from Python on the int8 input it gets there "
        "(forward plans off; min / median us over interleaved blocks); arithmetic = 2 x multiply-adds / the VNNI "
        "peak of this many threads; above = plan step minimum - arithmetic. Every digits CNN layer, and "
        f"MobileNetV2's {smallest} smallest by multiply-adds (with the largest 'above' over all of its layers). "
        "The forward's cost beyond its steps is the last table.")
    rep()
    for n in threads:
        torch.set_num_threads(n)
        peak = max(_C.native_peak_ops(2_000_000, n) for _ in range(5))
        rows, totals = [], []
        for name in models:
            with torch.inference_mode(False), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                case = MODELS[name](batch_size=1, num_calibration_batches=2, num_eval_batches=1)
                q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
            x = tuple(case.example_inputs)
            q.forward_plans = False
            calls = {}  # layer -> (its input args, its output)
            hooks = [q.layer(layer).register_forward_hook(
                lambda m, args, out, layer=layer: calls.setdefault(layer, (args, out)) and None)  # None: output kept
                for layer in q.qbackend_layers]
            q(*x)
            for h in hooks:
                h.remove()
            macs_of = {layer: _layer_macs(rec, calls[layer][1]) for layer, rec in q.qbackend_layers.items()
                       if layer in calls}
            recs = {layer: q.qbackend_layers[layer] for layer, macs in macs_of.items() if macs}
            cands = {layer: (lambda m=q.layer(layer), a=calls[layer][0]: m(*a)) for layer in recs}
            t = cfg.run(cands)
            q.forward_plans = True
            prof = profile_plan(q, *x, repeats=300)
            step_of = {}
            for st in prof.steps:
                if st.layer is not None:
                    prev = step_of.get(st.layer)
                    step_of[st.layer] = st if prev is None else \
                        type(st)(st.op, st.module, st.layer, prev.min_us + st.min_us, prev.median_us + st.median_us)
            table = []
            # a fused block's step runs several layers ("a+b+c"): one row for the step, beside the sum of its
            # layers' module calls (each layer called alone)
            groups = {key: key.split("+") for key in step_of if "+" in key}
            fused = {layer for members in groups.values() for layer in members}
            for layer in [lay for lay in recs if lay not in fused] + list(groups):
                members = groups.get(layer, [layer])
                if any(m not in recs for m in members):
                    continue
                macs = sum(macs_of[m] for m in members)
                arith = 2 * macs / peak * 1e6
                st = step_of.get(layer)
                step = f"{st.min_us:.2f} / {st.median_us:.2f}" if st else "-"
                above = st.min_us - arith if st else float("nan")
                rec = recs[members[0]]
                module_call = str(t[layer]) if layer in t else \
                    f"{sum(t[m].min_us for m in members):.2f} (sum of the {len(members)} layers' minima)"
                table.append((macs, [name, layer if len(members) == 1 else f"{layer} (fused)",
                                     rec.kind if len(members) == 1 else "fused block",
                                     rec.route.provider if rec.route else "-", f"{macs:,}",
                                     f"{arith:.2f}", step, f"{above:.2f}", module_call]))
            worst = max(table, key=lambda r: float(r[1][7]))
            chosen = sorted(table, key=lambda r: r[0])[:smallest]
            rows += [r for _, r in chosen]
            if worst not in chosen:
                rows.append([c if i != 1 else f"{c} (largest above)" for i, c in enumerate(worst[1])])
            totals.append([name, str(len(prof.steps))]
                          + [f"{v[0]:.1f} / {v[1]:.1f}" for v in (prof.steps_sum_us, prof.replay_us, prof.forward_us)]
                          + [f"{v[0]:.2f} / {v[1]:.2f}" for v in (prof.entry_us, prof.loop_us)]
                          + [f"{prof.overhead_per_step_us(1):.2f}"])
        progress(f"layer calls {n}t")
        rep(f"### {tn(n)}, VNNI peak {peak / 1e12:.3f} TOPS")
        rep()
        rep.table(["model", "layer", "kind", "provider", "multiply-adds", "arithmetic us", "plan step us (min / median)",
                   "above (us)", "module call us (min / median)"], rows)
        rep("Whole forward against its plan's steps (us, min / median over 300 timed replays and 300 forwards "
            "back to back): the sum of the steps, the native replay, the model's Python call; then what "
            "a forward costs beyond its steps, each taken within one call: the Python entry (a call less the "
            "replay inside it) and the replay loop (a replay less its steps); overhead per step = their sum at "
            "the medians / steps.")
        rep()
        rep.table(["model", "steps", "sum of steps", "native replay", "forward (Python call)", "Python entry",
                   "replay loop", "overhead / step (us)"],
                  totals)


def bench_peak(rep: Report, cfg: Settings, threads: list[int], quick: bool) -> None:
    """The native GEMM's throughput at M=2048, K=N=4096 against the dot-product instruction's peak,
    measured here with a loop of independent dot products of the kernel's instruction (tdpbusd on
    AMX, vpdpbusd on AVX512-VNNI; no assumption about clocks or ports)."""
    if not NATIVE:
        rep("## Native GEMM throughput: skipped (this CPU has no AVX512-VNNI)")
        rep()
        return
    M, K, N = (256, 1024, 1024) if quick else PEAK_SHAPE
    weight = make_linear_weight(K, N)
    s = make_linear(M, K, N, weight)
    cands = {k: v for k, v in linear_candidates(s).items() if k in PROVIDER_COLUMNS}
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        peak = max(_C.native_peak_ops(200_000 if quick else 2_000_000, n) for _ in range(3 if quick else 7))
        with quantized_engine("fbgemm"):
            t = cfg.run(cands)
        ops_ = 2 * M * K * N
        cells = []
        for k in PROVIDER_COLUMNS:
            tops = ops_ / (t[k].min_us * 1e-6) / 1e12
            cells += [f"{tops:.3f}", f"{100 * tops * 1e12 / peak:.0f}%"]
        rows.append([tn(n), f"{peak / 1e12:.3f}"] + cells
                    + [fr(ratio(min(t["fbgemm"].min_us, t["onednn"].min_us), t["native"].min_us))])
        progress(f"peak {n}t: {peak / 1e12:.3f} TOPS")
    rep(f"## Native GEMM throughput, M={M}, K={K}, N={N}, u8 -> u8")
    rep()
    amx = NATIVE_ISA == "amx"
    loop = ("independent `tdpbusd` (AMX-INT8 tile dot products, 16 x 16 x 64 multiply-adds each" if amx
            else "independent `vpdpbusd` (AVX512-VNNI dot products")
    rep(f"peak = int8 ops/s of a loop of {loop}, 2 ops per multiply-add) "
        "on that many threads, best of several runs (`qbackend._C.native_peak_ops`); TOPS from each provider's "
        "minimum time; % = share of that peak; native speed-up = best of fbgemm and onednn / native."
        + ("" if amx else " This CPU has no AMX (or QBACKEND_ISA masks it), so the AVX512-VNNI peak is the ceiling."))
    rep()
    hdr = ["threads", f"{'AMX' if amx else 'VNNI'} peak TOPS"]
    for k in PROVIDER_COLUMNS:
        hdr += [f"{k} TOPS", f"{k} % peak"]
    rep.table(hdr + ["native speed-up"], rows)


# ---------------------------------------------------------------------------------------------
# 4. targets

def _short(p: PeerRow, r: float) -> str:
    return f"{p.label} {p.threads}t {r:.2f}"


def _listing(vals) -> str:
    return ", ".join(_short(p, r) for r, p in sorted(vals, key=lambda v: -v[0]))


def targets(rep: Report, peers: list[PeerRow]) -> None:
    rep("## Targets: provider / peer <= 1.10 (min times)")
    rep()
    rep("Ratios of wall-time minima (outside --quick, pairs over the target were re-measured with extra blocks "
        "first; the tables show the merged result).")
    rep()
    noisy = [p for p in peers if p.contended and p.section in ("linear", "conv")]
    if noisy:
        rep(f"Rows marked † in the tables ({len(noisy)}: "
            + ", ".join(f"{p.section} {p.label} {p.threads}t" for p in noisy)
            + ") stayed disturbed by other processes after re-measurement (some candidate over 1.5x its own "
              "1-thread time): they are left out below.")
        rep()
    main = [p for p in peers if p.section in ("linear", "conv") and not p.contended]
    for attr, what in (("fb", "fbgemm provider / torch `quantized::*` (fbgemm engine)"),
                       ("dn", "onednn provider / direct `onednn::*`")):
        vals = [(getattr(p, attr), p) for p in main if getattr(p, attr) == getattr(p, attr)]
        if not vals:
            continue
        worst, wp = max(vals, key=lambda v: v[0])
        over = [v for v in vals if v[0] > TARGET]
        rep(f"- **{what}**: worst **{worst:.2f}** ({wp.section} {wp.label}, {wp.threads}t); "
            f"{len(over)} of {len(vals)} rows over {TARGET:.2f}.")
        if attr == "fb":
            dw8 = [v for v in over if v[1].depthwise]
            rest = [v for v in vals if not v[1].depthwise]
            if dw8:
                rep(f"  - depthwise convs with 8-bit activations (the provider's exact route; torch's FBGEMM "
                    f"depthwise kernel is not exact there, see dLSB): {len(dw8)} row{'s' if len(dw8) != 1 else ''} over, "
                    f"{min(v[0] for v in dw8):.2f}-{max(v[0] for v in dw8):.2f}: {_listing(dw8)}")
            if rest:
                w2, p2 = max(rest, key=lambda v: v[0])
                o2 = [v for v in rest if v[0] > TARGET]
                rep(f"  - all other rows: worst {w2:.2f} ({p2.section} {p2.label}, {p2.threads}t)"
                    + (f"; over {TARGET:.2f}: " + _listing(o2) if o2 else ""))
            dw7 = [(p.fb, p) for p in peers if p.section == "conv-dw7" and not p.contended]
            if dw7:
                w3, p3 = max(dw7, key=lambda v: v[0])
                o3 = [v for v in dw7 if v[0] > TARGET]
                rep(f"  - depthwise with 7-bit activations (like for like): worst {w3:.2f} ({p3.label}, "
                    f"{p3.threads}t)" + (f"; {len(o3)} row{'s' if len(o3) != 1 else ''} over {TARGET:.2f}: " + _listing(o3) if o3 else ""))
        else:
            for section in ("linear", "conv"):
                o = [v for v in over if v[1].section == section]
                if not o:
                    continue
                notes = sorted({v[1].note for v in o if v[1].note})
                rep(f"  - {section}: {len(o)} row{'s' if len(o) != 1 else ''}"
                    + (f" (oneDNN reorders per call, qbackend / direct: {' or '.join(notes)})" if notes else "")
                    + ": " + _listing(o))
        cpu_ok = [(r, p) for r, p in over if p.threads == 1 and getattr(p, attr + "_cpu") <= TARGET]
        if cpu_ok:
            rep(f"  - of these, 1-thread rows within the target on process CPU time (so likely disturbed "
                f"wall times): " + ", ".join(f"{p.label} {getattr(p, attr + '_cpu'):.2f}" for r, p in cpu_ok))
    rep()


# ---------------------------------------------------------------------------------------------
# 5. exact 8-bit activations without VNNI (run under QBACKEND_ISA=avx2)

AVX2_LINEAR_KN = [(256, 256), (512, 1000), (768, 768), (768, 3072), (3072, 768), (2048, 1000)]
AVX2_LINEAR_M = [1, 4, 8, 16, 32, 128]
AVX2_CONV = ["r50 stem 7x7/2", "r50 s1 3x3 64", "r50 s3 1x1 1024->256", "r50 s4 3x3 512", "mv2 pw 96->24 @56",
             "mv2 pw 576->160 @7", "mv2 dw 32 @112", "mv2 dw/2 96 @112", "mv2 dw 144 @56", "mv2 dw/2 144 @56",
             "mv2 dw 192 @28", "mv2 dw 384 @14", "mv2 dw 576 @14", "mv2 dw/2 576 @14", "mv2 dw 960 @7"]
# The two activation grids of the same float range [-6.4, 6.35]: 8 bits (the native route) and 7 bits
# (the only input FBGEMM and oneDNN multiply exactly without VNNI).
GRID8, GRID7 = (0.05, 128, 255), (0.1, 64, 127)
# Inputs after a ReLU (most dense convs of a CNN): zero point 0, where oneDNN's 7-bit convs skip
# their zero-point compensation.
GRID8_RELU, GRID7_RELU = (0.05, 0, 255), (0.1, 0, 127)
AVX2_CONV_RELU = ["r50 s1 3x3 64", "r50 s2 3x3 128", "r50 s3 3x3 256", "r50 s4 3x3 512", "r50 s2 3x3/2 128",
                  "r50 s1 1x1 256->64", "r50 s2 1x1 512->128", "r50 s3 1x1 1024->256", "r50 s4 1x1 2048->512",
                  "r50 s3 1x1 256->1024"]


def sqnr_db(y: torch.Tensor, ref: torch.Tensor) -> float:
    err = float(((y.double() - ref) ** 2).mean())
    return 10 * math.log10(float((ref ** 2).mean()) / err) if err > 0 else float("inf")


def _grid(x_f: torch.Tensor, grid) -> torch.Tensor:
    scale, zp, qmax = grid
    return torch.clamp(torch.round(x_f / scale) + zp, 0, qmax).to(torch.uint8)


def bench_avx2_exact(rep: Report, cfg: Settings, threads: list[int], quick: bool) -> None:
    """The native AVX2 GEMM on 8-bit activations against FBGEMM's and oneDNN's 7-bit routes: time
    (uint8 output) and SQNR of the fp32 output against fp64 math on the float input and weight."""
    if _C.native_isa() != "avx2" or X_BITS != 7:
        rep("## Exact 8-bit activations without VNNI")
        rep()
        rep(f"Skipped: run under QBACKEND_ISA=avx2 (here the native GEMM is `{_C.native_isa()}`).")
        rep()
        return
    rep("## Exact 8-bit activations without VNNI")
    rep()
    rep("Under QBACKEND_ISA=avx2: `native` is qbackend's AVX2 GEMM (int16 products, vpmaddwd) on 8-bit activations "
        f"(scale {GRID8[0]}, zero point {GRID8[1]}); `fbgemm` and `onednn` run the same float input on the 7-bit grid "
        f"(scale {GRID7[0]}, zero point {GRID7[1]}), the only one they multiply exactly here. Times in us (min / "
        "median), uint8 output. 7b/8b = the faster 7-bit route's time / the faster exact 8-bit one's (native; "
        "depthwise convs also oneDNN's depthwise kernel, exact at 8 bits here; < 1: the 7-bit route is faster). "
        "SQNR: dB of the fp32 output against fp64 math on the float input (uniform over the grids' range) and the "
        "dequantized weight; the difference is the cost of the 7-bit input.")
    rep()
    header_l = ["K x N", "M", "native 8-bit", "fbgemm 7-bit", "onednn 7-bit", "7b/8b", "SQNR 8-bit", "SQNR 7-bit",
                "winner"]
    rows: dict[int, list] = {n: [] for n in threads}
    kn = AVX2_LINEAR_KN[2:4] if quick else AVX2_LINEAR_KN
    for K, N in kn:
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8)
        ws, b = weight_scales(N, K), torch.empty(N).uniform_(-1, 1)
        pws = {p: PackedLinearWeight(w, ws, b, provider=p, x_shape=[128, K]) for p in ("native", "fbgemm", "onednn")}
        for M in AVX2_LINEAR_M:
            x_f = torch.empty(M, K).uniform_(-6.4, 6.35)
            x8, x7 = _grid(x_f, GRID8), _grid(x_f, GRID7)
            ref = torch.nn.functional.linear(x_f.double(), w.double() * ws.double()[:, None], b.double())
            f32 = torch.float32
            q8 = sqnr_db(pws["native"].linear(x8, GRID8[0], GRID8[1], 1.0, 0, f32), ref)
            q7 = sqnr_db(pws["fbgemm"].linear(x7, GRID7[0], GRID7[1], 1.0, 0, f32), ref)
            cands = {
                "native": lambda: pws["native"].linear(x8, GRID8[0], GRID8[1], OUT_SCALE, OUT_ZP, torch.uint8),
                "fbgemm": lambda: pws["fbgemm"].linear(x7, GRID7[0], GRID7[1], OUT_SCALE, OUT_ZP, torch.uint8),
                "onednn": lambda: pws["onednn"].linear(x7, GRID7[0], GRID7[1], OUT_SCALE, OUT_ZP, torch.uint8),
            }
            for n in threads:
                torch.set_num_threads(n)
                t = cfg.run(cands)
                m = {k_: v.min_us for k_, v in t.items()}
                fast7 = min(m["fbgemm"], m["onednn"])
                rows[n].append([f"{K}x{N}", str(M), str(t["native"]), str(t["fbgemm"]), str(t["onednn"]),
                                fr(fast7 / m["native"]), f"{q8:.1f}", f"{q7:.1f}", min(m, key=m.get)])
                progress(f"avx2 linear {n}t {K}x{N} M={M}: " + ", ".join(f"{k_} {fmt_us(v)}" for k_, v in m.items()))
    for n in threads:
        rep(f"### Linear, {tn(n)}")
        rep()
        rep.table(header_l, rows[n])

    for after_relu in (False, True):
        names = AVX2_CONV_RELU if after_relu else AVX2_CONV
        _avx2_conv_tables(rep, cfg, threads, [l for l in CONV_LAYERS if l[0] in (names[1:3] if quick else names)],
                          after_relu)


def _avx2_conv_tables(rep: Report, cfg: Settings, threads: list[int], layers: list, after_relu: bool) -> None:
    """The convs of bench_avx2_exact: inputs over a signed range (zero points 128 and 64), or after a
    ReLU (zero point 0 on both grids, the input uniform over [0, 12.75])."""
    g8, g7 = (GRID8_RELU, GRID7_RELU) if after_relu else (GRID8, GRID7)
    header_c = ["layer", "N", "C->OC", "HxW", "k/s/g", "native 8-bit", "onednn 8-bit", "fbgemm 7-bit",
                "onednn 7-bit", "7b/8b", "SQNR 8-bit", "SQNR 7-bit", "winner"]
    rows = {n: [] for n in threads}
    cl = torch.channels_last
    for layer in layers:
        name, C, OC, H, W, k, stride, pad, groups = layer
        depthwise = groups == C == OC
        w = torch.randint(-127, 128, (OC, C // groups, k, k), dtype=torch.int8)
        ws, b = weight_scales(OC, C // groups * k * k), torch.empty(OC).uniform_(-1, 1)
        geo = dict(stride=(stride, stride), padding=(pad, pad), dilation=(1, 1), groups=groups)
        x_f = torch.empty(1, C, H, W).uniform_(*((0.0, 12.75) if after_relu else (-6.4, 6.35))).contiguous(
            memory_format=cl)
        x8, x7 = _grid(x_f, g8), _grid(x_f, g7)
        ref = torch.nn.functional.conv2d(x_f.double(), w.double() * ws.double()[:, None, None, None], b.double(),
                                         stride, pad, 1, groups)
        # 8-bit: the native GEMM or depthwise conv, and oneDNN's depthwise kernel (exact at 8 bits here).
        p8s = ("native", "onednn") if depthwise else ("native",)
        pw8 = {p: PackedConv2dWeight(w, ws, b, provider=p, x_shape=list(x8.shape), x_qparams=g8[:2], **geo)
               for p in p8s}
        pw7 = {p: PackedConv2dWeight(w, ws, b, provider=p, x_shape=list(x7.shape), x_qparams=g7[:2], **geo)
               for p in ("fbgemm", "onednn")}
        f32 = torch.float32
        q8 = sqnr_db(pw8["native"].conv2d(x8, g8[0], g8[1], 1.0, 0, f32), ref)
        q7 = sqnr_db(pw7["onednn"].conv2d(x7, g7[0], g7[1], 1.0, 0, f32), ref)
        cands = {p: (lambda pw=pw: pw.conv2d(x8, g8[0], g8[1], OUT_SCALE, OUT_ZP, torch.uint8))
                 for p, pw in pw8.items()}
        cands.update({
            "fbgemm_7": lambda: pw7["fbgemm"].conv2d(x7, g7[0], g7[1], OUT_SCALE, OUT_ZP, torch.uint8),
            "onednn_7": lambda: pw7["onednn"].conv2d(x7, g7[0], g7[1], OUT_SCALE, OUT_ZP, torch.uint8),
        })
        for n in threads:
            torch.set_num_threads(n)
            t = cfg.run(cands)
            m = {k_: v.min_us for k_, v in t.items()}
            fast7 = min(m["fbgemm_7"], m["onednn_7"])
            rows[n].append([name, "1", f"{C}->{OC}", f"{H}x{W}", f"{k}/{stride}/{groups}",
                            str(t["native"]) if "native" in t else "refuses", str(t["onednn"]) if "onednn" in t else "saturates",
                            str(t["fbgemm_7"]), str(t["onednn_7"]), fr(fast7 / min(m[p] for p in p8s)), f"{q8:.1f}", f"{q7:.1f}",
                            min(m, key=m.get)])
            progress(f"avx2 conv {n}t {name}: " + ", ".join(f"{k_} {fmt_us(v)}" for k_, v in m.items()))
    for n in threads:
        rep(f"### Conv2d after a ReLU (zero point 0), channels-last, batch 1, {tn(n)}" if after_relu
            else f"### Conv2d, channels-last, batch 1, {tn(n)}")
        rep()
        rep.table(header_c, rows[n])


# ---------------------------------------------------------------------------------------------

def header(rep: Report, threads: list[int], quick: bool, cfg: Settings) -> None:
    rep("# qbackend kernel benchmark")
    rep()
    for line in run_lines(threads):
        rep(line)
    rep(f"- method: {cfg.blocks} blocks of about {cfg.block_s * 1e3:g} ms (at least one call) per candidate after "
        f"warm-up, candidates of a row interleaved round-robin; "
        + (f"a provider/peer pair over {TARGET:.2f} is re-measured with {cfg.confirm_blocks} more blocks; "
           if cfg.confirm_blocks else "no re-measurement; ")
        + f"times are us per call, min / median over the blocks; ratios use the "
        f"minima. Run under `torch.inference_mode()`. The machine may be shared: trust ratios within a row more "
        f"than absolute times." + (" **--quick: few shapes and iterations, a smoke test only.**" if quick else ""))
    rep(f"- int8 setup: uint8 activations over the {'full 8-bit' if X_BITS == 8 else '7-bit (no VNNI here)'} range "
        f"(scale {X_SCALE}, zero point {X_ZP}), symmetric "
        f"per-channel int8 weights, fp32 bias, uint8 output (requantized, scale {OUT_SCALE:.4f}, zero point "
        f"{OUT_ZP}). Every candidate has its own packed weight: the onednn peers "
        f"prepack with `onednn::qlinear_prepack` / `onednn::qconv_prepack` directly, with the same input-shape hint "
        f"as the provider (the conv peer also with the real x scale / zero point); every block starts with one "
        f"untimed call so each candidate runs with its own weights in cache. "
        f"FP32/BF16 use the same (dequantized) weights, BF16 pre-converted; convs channels-last throughout.")
    rep()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2 (default 1)")
    ap.add_argument("--quick", action="store_true", help="a few shapes and iterations (CI smoke test, < 60 s)")
    ap.add_argument("--only", choices=["linear", "conv", "avx2_exact", "layer_calls"],
                    help="run one section only (avx2_exact: the native AVX2 GEMM on 8-bit activations against the "
                    "libraries' 7-bit routes; run it under QBACKEND_ISA=avx2)")
    ap.add_argument("--out", help="also write the markdown to this file")
    ap.add_argument("--batch16", choices=["all", "subset"], default="all",
                    help="conv layers measured at batch 16 (default all)")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    cfg = QUICK if args.quick else FULL
    torch.manual_seed(0)
    start = time.perf_counter()
    rep = Report()
    header(rep, threads, args.quick, cfg)
    peers: list[PeerRow] = []
    old_threads, old_engine = torch.get_num_threads(), torch.backends.quantized.engine
    try:
        with torch.inference_mode():
            if args.only in (None, "linear"):
                bench_peak(rep, cfg, threads, args.quick)
                bench_linear(rep, cfg, threads, args.quick, peers)
            if args.only in (None, "conv"):
                bench_conv(rep, cfg, threads, args.quick, args.batch16, peers)
            if args.only == "avx2_exact" or (args.only is None and NATIVE_ISA == "avx2"):
                bench_avx2_exact(rep, cfg, threads, args.quick)
            if args.only in (None, "layer_calls") and not args.quick:
                bench_layer_calls(rep, cfg, threads, args.quick)
            if args.only not in ("avx2_exact", "layer_calls"):
                bench_overhead(rep, cfg, threads, args.only)
                targets(rep, peers)
    finally:
        torch.set_num_threads(old_threads)
        torch.backends.quantized.engine = old_engine
    rep(f"Total benchmark time: {time.perf_counter() - start:.0f} s; load average at the end {load_average()}.")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(rep.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
