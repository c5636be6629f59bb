#!/usr/bin/env python
"""Embedding benchmark: a DLRM-style model's memory, lookup speed and output error with its tables
rowwise-quantized by qbackend, against FP32 and torch's quantized embedding-bag ops, in one run.

    python benchmarks/embeddings.py [--quick] [--tables 8] [--rows 1000000] [--dim 64] [--batch 2048]
                                    [--min-bag 20] [--max-bag 80] [--threads 2] [--out FILE]

Model (qbackend.models.dlrm): `--tables` nn.EmbeddingBag(rows, dim, mode="sum") tables (DLRM's
init, uniform in +-sqrt(1/rows)), a bottom MLP 13 -> 256 -> 128 -> dim on dense features and a
top MLP (tables + 1) * dim -> 256 -> 128 -> 1; batch `--batch`, bag lengths uniform in
[min_bag, max_bag], indices uniform over each table. Converted with qbackend.quantize (2
calibration batches): every table 8-bit, then 4-bit, fp16 scale/bias per row
(`EmbeddingConfig(bits, min_weights=0)`: --quick's small tables too), the MLPs static INT8.

1. Memory: bytes of each model's parameters, buffers and packed weights (tables: the packed
   rows; Linear layers: int8 weight + the provider's packed copy, counted as a second int8 copy,
   + scales and bias), and the ratio to FP32 (targets: INT8 <= 0.27x, INT4 <= 0.15x).
2. Lookups per second of the `--tables` table lookups of one batch (sum bags), per provider:
   FP32 nn.EmbeddingBag, torch's `quantized::embedding_bag_byte_rowwise_offsets` /
   `embedding_bag_4bit_rowwise_offsets` (deprecated quantized stack; their own prepacked tables),
   qbackend's built-in kernel and fbgemm_gpu's table-batched kernel (if installed), 8 and 4 bits;
   interleaved blocks, minima and medians.
3. The whole model: FP32 vs the INT8 and INT4 models, latency per batch (interleaved) and the
   output error against FP32 (SQNR of the logits, max |delta| of the click probability).
Nothing is asserted (the machine is shared); the tables print ratios measured side by side.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import fmt_us, measure  # noqa: E402
from _machine import cpu_model_name, git_state, load_average  # noqa: E402
from int8_kernels import Report  # noqa: E402

import qbackend  # noqa: E402
from qbackend import EmbeddingConfig, QuantConfig  # noqa: E402
from qbackend.lowering.convert import FP32FallbackWarning  # noqa: E402
from qbackend.models import dlrm, dlrm_inputs  # noqa: E402
from qbackend.ops import PackedConv2dWeight, PackedLinearWeight  # noqa: E402
from qbackend.ops.embedding import EMBEDDING_PROVIDERS, PackedEmbeddingTable  # noqa: E402


def progress(msg: str) -> None:
    print(f"[embeddings] {msg}", file=sys.stderr, flush=True)


def model_bytes(module: torch.nn.Module) -> int:
    """Parameters, buffers (each storage once) and packed weights held by `module`."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    for m in module.modules():
        p = getattr(m, "packed", None)
        if isinstance(p, PackedEmbeddingTable):
            total += p.nbytes()
        elif isinstance(p, (PackedLinearWeight, PackedConv2dWeight)):
            total += 2 * p.weight.numel() + 4 * p.w_scales.numel() + (4 * p.bias.numel() if p.bias is not None else 0)
    return total


def fmt_bytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    noise = (ref - out).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.pow(2).sum() / noise))


def machine() -> str:
    f = qbackend.cpu_features()
    return f"{cpu_model_name('unknown CPU')}, {os.cpu_count()} logical CPUs; ISA class `{f.isa_class}`"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few blocks (CI smoke test)")
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--min-bag", type=int, default=20)
    ap.add_argument("--max-bag", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the markdown report to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.dim, args.batch = 2, 20_000, 16, 64
    torch.set_num_threads(args.threads)
    blocks = 5 if args.quick else 15
    rep = Report()
    started = datetime.datetime.now(datetime.timezone.utc)
    have_fbgemm_gpu = EMBEDDING_PROVIDERS["fbgemm_gpu"].available()
    fbgemm_gpu_version = "not installed"
    if have_fbgemm_gpu:
        import fbgemm_gpu
        fbgemm_gpu_version = getattr(fbgemm_gpu, "__version__", "?")

    progress(f"building the model: {args.tables} tables of {args.rows} x {args.dim}")
    model = dlrm(args.tables, args.rows, args.dim)

    def batch(seed):
        return dlrm_inputs(args.batch, args.tables, args.rows, min_bag=args.min_bag, max_bag=args.max_bag,
                           seed=seed)

    calibration = [batch(1), batch(2)]
    held_out = batch(100)
    lookups = sum(int(i.numel()) for i in held_out[1])

    qmodels, quant_s = {}, {}
    for bits in (8, 4):
        progress(f"quantizing: tables {bits}-bit, MLPs int8")
        gc.collect()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FP32FallbackWarning)
            qmodels[bits] = qbackend.quantize(model, calibration[0], calibration,
                                              config=QuantConfig(embedding=EmbeddingConfig(bits=bits, min_weights=0)))
        quant_s[bits] = time.perf_counter() - t0

    rep("# qbackend embedding benchmark: a DLRM-style model with rowwise-quantized tables")
    rep()
    rep("`python benchmarks/embeddings.py" + (" --quick" if args.quick else "") + "`")
    rep()
    rep(f"- CPU: {machine()}")
    rep(f"- threads: {args.threads}; torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()}), "
        f"fbgemm_gpu {fbgemm_gpu_version}, Python {platform.python_version()}")
    rep(f"- date: {started:%Y-%m-%d %H:%M} UTC; load average at start {load_average()}")
    rep(f"- model: {args.tables} x nn.EmbeddingBag({args.rows:,}, {args.dim}, mode='sum') + bottom MLP 13-256-128-"
        f"{args.dim} + top MLP {(args.tables + 1) * args.dim}-256-128-1; batch {args.batch}, bags of "
        f"{args.min_bag}-{args.max_bag} indices ({lookups:,} lookups per batch over all tables), uniform indices")
    rep(f"- quantize (calibrate 2 batches + convert, tables quantized rowwise with fp16 scale/bias): "
        f"8-bit {quant_s[8]:.1f} s, 4-bit {quant_s[4]:.1f} s")
    rep()

    # ---- 1. memory ------------------------------------------------------------------------
    fp32_bytes = model_bytes(model)
    rows = [["FP32", fmt_bytes(fp32_bytes), "1.000", "-"]]
    for bits, target in ((8, 0.27), (4, 0.15)):
        b = model_bytes(qmodels[bits])
        r = b / fp32_bytes
        rows.append([f"qbackend tables {bits}-bit + MLPs int8", fmt_bytes(b), f"{r:.3f}",
                     f"<= {target} {'met' if r <= target else '**missed**'}"])
    rep("## Model memory")
    rep()
    rep.table(["model", "bytes", "ratio to FP32", "target"], rows)

    # ---- 2. lookups -----------------------------------------------------------------------
    progress("timing the table lookups")
    _, indices, offsets = held_out
    tables = list(model.tables)
    candidates = {"FP32 nn.EmbeddingBag": lambda: [t(i, o) for t, i, o in zip(tables, indices, offsets)]}
    qops = torch.ops.quantized
    byte_tables = [qops.embedding_bag_byte_prepack(t.weight.detach()) for t in tables]
    nibble_tables = [qops.embedding_bag_4bit_prepack(t.weight.detach()) for t in tables]
    candidates["torch quantized 8-bit (byte_rowwise_offsets)"] = lambda: [
        qops.embedding_bag_byte_rowwise_offsets(w, i, o, False, 0, False, None, None, False)
        for w, i, o in zip(byte_tables, indices, offsets)]
    candidates["torch quantized 4-bit (4bit_rowwise_offsets)"] = lambda: [
        qops.embedding_bag_4bit_rowwise_offsets(w, i, o, False, 0, False, None, None, False)
        for w, i, o in zip(nibble_tables, indices, offsets)]
    packed = {}
    for bits in (8, 4):
        canon = [qmodels[bits].layer(f"tables.{k}").packed.table() for k in range(args.tables)]
        for provider in EMBEDDING_PROVIDERS:
            if provider == "fbgemm_gpu" and not have_fbgemm_gpu:
                continue
            ps = [PackedEmbeddingTable(c, args.dim, bits, provider) for c in canon]
            packed[(provider, bits)] = ps
            candidates[f"qbackend {provider} {bits}-bit"] = (
                lambda ps=ps: [p.bag(i, o) for p, i, o in zip(ps, indices, offsets)])
    t = measure(candidates, blocks=blocks, block_s=0.05, budget_s=3.0 if args.quick else 20.0)
    base = t["FP32 nn.EmbeddingBag"].min_us
    rows = []
    for name, tm in t.items():
        rows.append([name, fmt_us(tm.min_us), fmt_us(tm.median_us), f"{lookups / (tm.min_us * 1e-6) / 1e6:,.1f}",
                     f"{base / tm.min_us:.2f}x"])
    rep("## Table lookups (one batch, all tables, sum bags)")
    rep()
    rep("Time per batch in us (min / median over interleaved blocks); lookups per second on the minimum.")
    rep()
    rep.table(["provider", "min us", "median us", "M lookups/s", "speed vs FP32"], rows)
    if not have_fbgemm_gpu:
        rep("fbgemm_gpu is not installed here (`pip install fbgemm-gpu-cpu==1.8.0`): its rows are missing.")
        rep()
    # the providers agree bit for bit
    agree = []
    for bits in (8, 4):
        outs = {p: torch.cat([x.bag(i, o) for x, i, o in zip(ps, indices, offsets)], 1)
                for (p, b), ps in packed.items() if b == bits}
        if len(outs) == 2:
            agree.append(f"{bits}-bit: {'identical' if torch.equal(*outs.values()) else 'DIFFERENT'}")
    if agree:
        rep(f"- builtin vs fbgemm_gpu outputs on this batch: {'; '.join(agree)}")
        rep()

    # ---- 3. whole model -------------------------------------------------------------------
    progress("timing the whole models")
    with torch.no_grad():
        ref = model(*held_out)
        outs = {bits: q(*held_out) for bits, q in qmodels.items()}
        tw = measure({"FP32": lambda: model(*held_out), **{f"INT8 tables {b}-bit": (lambda q=q: q(*held_out))
                                                          for b, q in qmodels.items()}},
                     blocks=blocks, block_s=0.05, budget_s=3.0 if args.quick else 20.0)
    rows = []
    for name, tm in tw.items():
        bits = None if name == "FP32" else int(name.split()[2].split("-")[0])
        err = "-" if bits is None else f"{sqnr(ref, outs[bits]):.1f}"
        dp = "-" if bits is None else f"{float((torch.sigmoid(ref) - torch.sigmoid(outs[bits])).abs().max()):.2e}"
        rows.append([name, fmt_us(tm.min_us), fmt_us(tm.median_us), f"{tw['FP32'].min_us / tm.min_us:.2f}x", err, dp])
    rep("## Whole model (one batch)")
    rep()
    rep.table(["model", "min us", "median us", "speed vs FP32", "logit SQNR vs FP32 (dB)",
               "max |delta click probability|"], rows)
    rep(f"- load average at the end: {load_average()}")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(rep.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
