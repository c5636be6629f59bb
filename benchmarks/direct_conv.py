"""The native provider's direct convolution (csrc/kernels/conv_amx.cpp, conv_avx512_vnni.cpp: the taps
read in place from a zero-point-padded copy of the input) against its GEMM over gathered taps and
against oneDNN, on ResNet-18's and ResNet-50's KxK convs over a multiple of 64 channels (the ones it
can take), at batch 1 and 32, with and without a fused int8 residual: the measurement behind the
kernel's direct-conv limits (GemmKernels::direct_conv_stride1, direct_conv_max_weight) and the KxK
rows of qbackend/dispatch/rules.py.

    python benchmarks/direct_conv.py [--threads 2] [--quick] [--out FILE]

Per layer every candidate is timed interleaved in one process (benchmarks/_timing.py, the minimum
over blocks); the native kernel is the CPU's own. "direct" is the native provider as it routes (the
direct route where the kernel takes the conv, `route` says whether it did), "gathered" the same with
the direct route switched off; ratios > 1: the direct route is faster.
"""
from __future__ import annotations

import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import qbackend  # noqa: E402
from _machine import cpu_line, git_state, load_average, write_report  # noqa: E402
from _timing import measure  # noqa: E402
from kxk_conv import LAYERS  # noqa: E402
from pointwise_conv import conv_bench_args  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.ops import PackedConv2dWeight  # noqa: E402


def _switched(direct: bool, call):
    def run():
        _C.set_native_direct_conv(direct)
        return call()
    return run


def main(argv=None) -> int:
    args = conv_bench_args(__doc__, argv, "batch 1, two layers, few blocks (smoke test)", raw=True)
    if args is None:
        return 0
    layers = [layer for layer in LAYERS if layer[1] % 64 == 0]
    layers = layers[:2] if args.quick else layers
    lines = ["# The native direct convolution against its gathered taps and oneDNN", "", cpu_line(),
             f"- threads: {args.threads}; torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()}); "
             f"native kernel `{_C.native_isa()}`",
             f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start "
             f"{load_average()}",
             "- times: us per call, minimum over interleaved blocks; route: whether the native provider took the "
             "direct route; gathered / direct and oneDNN / direct: > 1, the direct route is faster", "",
             "| layer | batch | route | direct | gathered | oneDNN | gathered / direct | oneDNN / direct | "
             "direct +res | gathered +res | oneDNN +res | gathered / direct +res | oneDNN / direct +res |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cl = torch.channels_last
    try:
        for batch in (1,) if args.quick else (1, 32):
            for model, ci, co, hw, k, s, pad in layers:
                w = torch.randint(-127, 128, (co, ci, k, k), dtype=torch.int8)
                ws, b = torch.rand(co) * 0.01 + 1e-3, torch.randn(co)
                x = torch.randint(0, 256, (batch, ci, hw, hw), dtype=torch.uint8).contiguous(memory_format=cl)
                oh = (hw + 2 * pad - k) // s + 1
                acc = torch.randint(0, 256, (batch, co, oh, oh), dtype=torch.uint8).contiguous(memory_format=cl)
                native = PackedConv2dWeight(w, ws, b, (s, s), (pad, pad), (1, 1), 1, "native")
                onednn = PackedConv2dWeight(w, ws, b, (s, s), (pad, pad), (1, 1), 1, "onednn",
                                            x_shape=list(x.shape), x_qparams=(0.02, 128))
                plain = [x, 0.02, 128, 0.1, 128, torch.uint8, "relu"]
                res = plain + [acc, 0.05, 128]
                before = _C.native_direct_conv_calls()
                _C.set_native_direct_conv(True)
                native.conv2d(*plain)
                route = "direct" if _C.native_direct_conv_calls() > before else "gathered"
                cands = {"direct": _switched(True, lambda: native.conv2d(*plain)),
                         "gathered": _switched(False, lambda: native.conv2d(*plain)),
                         "onednn": lambda: onednn.conv2d(*plain),
                         "direct+res": _switched(True, lambda: native.conv2d(*res)),
                         "gathered+res": _switched(False, lambda: native.conv2d(*res)),
                         "onednn+res": lambda: onednn.conv2d(*res)}
                with torch.inference_mode():
                    t = measure(cands, blocks=5 if args.quick else 15, block_s=0.005)
                m = {key: v.min_us for key, v in t.items()}
                name = f"{model} {ci}->{co} @{hw} {k}x{k} s{s}"
                lines.append(f"| {name} | {batch} | {route} | {m['direct']:.1f} | {m['gathered']:.1f} | "
                             f"{m['onednn']:.1f} | {m['gathered'] / m['direct']:.2f} | {m['onednn'] / m['direct']:.2f} | "
                             f"{m['direct+res']:.1f} | {m['gathered+res']:.1f} | {m['onednn+res']:.1f} | "
                             f"{m['gathered+res'] / m['direct+res']:.2f} | {m['onednn+res'] / m['direct+res']:.2f} |")
                print(lines[-1], flush=True)
    finally:
        _C.set_native_direct_conv(True)
    lines += ["", f"Load average at the end: {load_average()}."]
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
