"""The native Winograd route for 3x3 stride-1 convs (csrc/providers/native_winograd.h) against the
GEMM routes it replaces, layer by layer, on ResNet's 3x3 stride-1 shapes.

Per layer, three calls interleaved in one process (benchmarks/_timing.py, the minimum over blocks):
  gemm7   the pair-product GEMM on 7-bit weights (what the AVX2 class ran these layers on before:
          QuantConfig.seven_bit_for_speed), the Winograd route switched off;
  gemm8   the int16-product GEMM on 8-bit weights (the GEMM fallback of the route's own weights);
  wino8   the Winograd route on 8-bit weights (what they run on now).
All three compute exact integer sums; gemm8 and wino8 give the same bytes (checked here).

    python benchmarks/winograd.py [--threads 1,2] [--batches 1,8] [--out FILE]

Runs on any AVX2 CPU: the native kernels are set to the AVX2 ones (set_native_kernel("avx2")), so on
a VNNI CPU it measures the AVX2 class's kernels, not what that CPU would use.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _machine import cpu_line, git_state, load_average, write_report  # noqa: E402
from _timing import measure  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.ops import PackedConv2dWeight  # noqa: E402

# (channels, input h = w): ResNet-18's and ResNet-50's 3x3 stride-1 convs (224 x 224 images)
LAYERS = [(64, 56), (128, 28), (256, 14), (512, 7)]


def _cases(batch: int):
    cl = torch.channels_last
    g = torch.Generator().manual_seed(batch)
    for c, hw in LAYERS:
        w8 = torch.randint(-128, 128, (c, c, 3, 3), dtype=torch.int8, generator=g)
        w7 = torch.randint(-64, 65, (c, c, 3, 3), dtype=torch.int8, generator=g)
        ws, b = torch.rand(c, generator=g) * 0.01 + 1e-3, torch.randn(c, generator=g)
        x = torch.randint(0, 256, (batch, c, hw, hw), dtype=torch.uint8, generator=g).contiguous(memory_format=cl)
        p8, p7 = (PackedConv2dWeight(w, ws, b, (1, 1), (1, 1), (1, 1), 1, "native", x_shape=list(x.shape),
                                     x_qparams=(0.02, 128)) for w in (w8, w7))

        def call(p, wino, x=x):
            _C.set_native_winograd(wino)
            return p.conv2d(x, 0.02, 128, 0.1, 128, torch.uint8, "relu")

        assert torch.equal(call(p8, True), call(p8, False))
        yield (f"{c} -> {c} @ {hw} x {hw}", batch, 2 * batch * hw * hw * c * c * 9,
               {"gemm7": lambda p=p7: call(p, False), "gemm8": lambda p=p8: call(p, False),
                "wino8": lambda p=p8: call(p, True)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    _C.set_native_kernel("avx2")
    lines = ["# The Winograd route for 3x3 stride-1 convs against the GEMM routes", "", cpu_line(),
             f"- torch {torch.__version__}, {git_state()}; native kernels: AVX2's; date "
             f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start "
             f"{load_average()}",
             f"- command: `python benchmarks/winograd.py --threads {args.threads} --batches {args.batches}`",
             "- us per call: the minimum over 10 blocks of about 30 ms, the three calls interleaved; uint8 in and "
             "out, relu, padding 1; GOPS: 2 x the direct conv's multiply-adds per second",
             "- gemm7: pair-product GEMM on 7-bit weights (the former route); gemm8: int16 GEMM on 8-bit weights; "
             "wino8: the Winograd route on 8-bit weights (the same bytes as gemm8); under 12 x 12 outputs (the 7 x 7 "
             "rows) the route keeps the GEMM, so wino8 is gemm8 there, and the rule table gives such layers 7-bit "
             "weights (gemm7)", ""]
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            lines += [f"## {threads} thread{'s' if threads > 1 else ''}", "",
                      "| layer | batch | gemm7 us | gemm8 us | wino8 us | wino8 GOPS | gemm7 / wino8 |",
                      "|---|---|---|---|---|---|---|"]
            for batch in (int(b) for b in args.batches.split(",")):
                for name, n, ops, calls in _cases(batch):
                    with torch.inference_mode():
                        r = measure(calls, blocks=10, block_s=0.03)
                    t7, t8, tw = (r[k].min_us for k in ("gemm7", "gemm8", "wino8"))
                    lines.append(f"| {name} | {n} | {t7:.0f} | {t8:.0f} | {tw:.0f} | {ops / tw / 1e3:.0f} | "
                                 f"{t7 / tw:.2f} |")
            lines.append("")
    finally:
        _C.set_native_kernel("")
        _C.set_native_winograd(True)
    lines.append(f"Load average at the end: {load_average()}.")
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
