"""The 1x1 convolutions of ResNet-50 and MobileNetV2 on the three providers (native, oneDNN,
FBGEMM), at batch 1 and 32, with and without a fused int8 residual: the measurement behind the
native provider's conv2d row in qbackend/dispatch/rules.py.

    python benchmarks/pointwise_conv.py [--threads 2] [--quick] [--out benchmarks/results/pointwise_conv.md]

Every layer is timed on all providers interleaved (benchmarks/_timing.py), uint8 channels-last
input, relu, uint8 output; "+res" adds an int8 residual of the output's shape. ratio = the faster
of oneDNN and FBGEMM / native (> 1: native is faster).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_line, git_state, load_average  # noqa: E402
from _timing import measure  # noqa: E402

import qbackend  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.ops import PackedConv2dWeight  # noqa: E402

# (model, c_in, c_out, input h = w, stride)
# Every distinct 1x1 conv of ResNet-50 (torchvision v1.5: the stride sits in the 3x3, so the only
# strided 1x1 convs are the downsamples) and of MobileNetV2, as (model, c_in, c_out, input h = w, stride).
LAYERS = [("R50", 64, 64, 56, 1), ("R50", 64, 256, 56, 1), ("R50", 256, 64, 56, 1), ("R50", 256, 128, 56, 1),
          ("R50", 256, 512, 56, 2), ("R50", 128, 512, 28, 1), ("R50", 512, 128, 28, 1), ("R50", 512, 256, 28, 1),
          ("R50", 512, 1024, 28, 2), ("R50", 256, 1024, 14, 1), ("R50", 1024, 256, 14, 1),
          ("R50", 1024, 512, 14, 1), ("R50", 1024, 2048, 14, 2), ("R50", 512, 2048, 7, 1), ("R50", 2048, 512, 7, 1),
          ("MBv2", 32, 16, 112, 1), ("MBv2", 16, 96, 112, 1), ("MBv2", 96, 24, 56, 1), ("MBv2", 24, 144, 56, 1),
          ("MBv2", 144, 24, 56, 1), ("MBv2", 144, 32, 28, 1), ("MBv2", 32, 192, 28, 1), ("MBv2", 192, 32, 28, 1),
          ("MBv2", 192, 64, 14, 1), ("MBv2", 64, 384, 14, 1), ("MBv2", 384, 64, 14, 1), ("MBv2", 384, 96, 14, 1),
          ("MBv2", 96, 576, 14, 1), ("MBv2", 576, 96, 14, 1), ("MBv2", 576, 160, 7, 1), ("MBv2", 160, 960, 7, 1),
          ("MBv2", 960, 160, 7, 1), ("MBv2", 960, 320, 7, 1), ("MBv2", 320, 1280, 7, 1)]
PROVIDERS = ("native", "onednn", "fbgemm")


def conv_bench_args(description: str, argv, quick: str, raw: bool = False) -> argparse.Namespace | None:
    """The conv benchmarks' command line (--threads, --quick, --out), the threads and seed set; None,
    after saying so, where the CPU has no native provider to compare."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not _C.native_isa():
        print("the native provider needs AVX512-VNNI or AVX-VNNI: nothing to compare on this CPU")
        return None
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args


def run_table(title: str, layers, argv=None) -> int:
    """Times `layers` ((model, c_in, c_out, input h = w, kernel, stride, padding[, groups]) each) on every
    provider, interleaved, at batch 1 and 32, with and without an int8 residual; prints the markdown
    table (and writes it to --out)."""
    args = conv_bench_args(title, argv, "batch 1, three layers, few blocks (smoke test)")
    if args is None:
        return 0
    lines = [f"# {title}", "", cpu_line(),
             f"- threads: {args.threads}; torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()}); "
             f"native kernel `{_C.native_isa()}`",
             f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start "
             f"{load_average()}",
             "- times: us per call, minimum over interleaved blocks; ratio = min(oneDNN, FBGEMM) / native", "",
             "| layer | batch | native | oneDNN | FBGEMM | ratio | native +res | oneDNN +res | FBGEMM +res | ratio +res |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    cl = torch.channels_last
    layers = layers[:3] if args.quick else layers
    for batch in (1,) if args.quick else (1, 32):
        for model, ci, co, hw, k, s, pad, *grp in layers:
            groups = grp[0] if grp else 1
            w = torch.randint(-127, 128, (co, ci // groups, k, k), dtype=torch.int8)
            ws, b = torch.rand(co) * 0.01 + 1e-3, torch.randn(co)
            x = torch.randint(0, 256, (batch, ci, hw, hw), dtype=torch.uint8).contiguous(memory_format=cl)
            oh = (hw + 2 * pad - k) // s + 1
            acc = torch.randint(0, 256, (batch, co, oh, oh), dtype=torch.uint8).contiguous(memory_format=cl)
            cands = {}
            for p in PROVIDERS:
                pw = PackedConv2dWeight(w, ws, b, (s, s), (pad, pad), (1, 1), groups, p, x_shape=list(x.shape),
                                        x_qparams=(0.02, 128))
                cands[p] = lambda pw=pw: pw.conv2d(x, 0.02, 128, 0.1, 128, torch.uint8, "relu")
                cands[p + "+res"] = lambda pw=pw: pw.conv2d(x, 0.02, 128, 0.1, 128, torch.uint8, "relu", acc, 0.05, 128)
            with torch.inference_mode():
                t = measure(cands, blocks=5 if args.quick else 15, block_s=0.005)
            m = {k: v.min_us for k, v in t.items()}
            r = min(m["onednn"], m["fbgemm"]) / m["native"]
            rr = min(m["onednn+res"], m["fbgemm+res"]) / m["native+res"]
            name = (f"{model} {ci}->{co} @{hw}" + (f" {k}x{k}" if k != 1 else "") + f" s{s}"
                    + (" dw" if groups == ci and groups > 1 else ""))
            lines.append(f"| {name} | {batch} | {m['native']:.1f} | {m['onednn']:.1f} | "
                         f"{m['fbgemm']:.1f} | {r:.2f} | {m['native+res']:.1f} | {m['onednn+res']:.1f} | "
                         f"{m['fbgemm+res']:.1f} | {rr:.2f} |")
            print(lines[-1], flush=True)
    lines += ["", f"Load average at the end: {load_average()}."]
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def main(argv=None) -> int:
    return run_table("1x1 convolutions: native vs oneDNN vs FBGEMM",
                     [(m, ci, co, hw, 1, s, 0) for m, ci, co, hw, s in LAYERS], argv)


if __name__ == "__main__":
    sys.exit(main())
