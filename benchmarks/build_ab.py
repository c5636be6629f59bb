"""Two builds of qbackend compared on the native provider's convs: ResNet-50's distinct 1x1 convs at
batch 32 (uint8 output with relu, alone and with an in-place int8-residual add; `--layers
resnet50_1x1`, the default), MobileNetV2's at batch 1 (the same, on 7-bit weights as its layers get
them without VNNI; `--layers mobilenet_v2_1x1`) or its depthwise convs at batch 1 (uint8 output with
relu; `--layers mobilenet_v2_depthwise`), ResNet's 3x3 stride-1 convs at batch 1 (the same, 8-bit
weights: the Winograd route where the CPU class has it; `--layers resnet_3x3`), or whole converted models at batch 1 (ResNet-18,
ResNet-50 and MobileNetV2 on 224 x 224 images, quantized in each process from the same seed;
`--layers models_b1`): the measurement behind a kernel change that only one build has, where no
peer differs between the builds.

Each build is a copy of the `qbackend` package (its compiled extension included) in its own folder;
the builds run in turn in fresh processes (A, B, A, B, ... or B first with --b-first: the order
is reported), each process timing every layer (the minimum over benchmarks/_timing.py's blocks),
and the table gives the medians over the rounds and B / A.

    python benchmarks/build_ab.py --a DIR_A --b DIR_B [--layers resnet50_1x1|mobilenet_v2_1x1|mobilenet_v2_depthwise|resnet_3x3|models_b1]
                                  [--rounds 4] [--threads 2] [--out FILE]

To make the two folders: copy `qbackend/` after building each commit (`python setup.py build_ext
--inplace`), e.g. `cp -r qbackend /tmp/a/` at the old commit and `cp -r qbackend /tmp/b/` at the new.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

# (c_in, c_out, input h = w): ResNet-50's distinct stride-1 1x1 convs
LAYERS = [(64, 64, 56), (64, 256, 56), (256, 64, 56), (256, 128, 56), (128, 512, 28), (512, 128, 28),
          (512, 256, 28), (256, 1024, 14), (1024, 256, 14), (1024, 512, 14), (512, 2048, 7), (2048, 512, 7)]
BATCH = 32
# (channels, input h = w, stride): MobileNetV2's distinct 3x3 depthwise convs (224 x 224 input)
DEPTHWISE = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2), (384, 14, 1),
             (576, 14, 1), (576, 14, 2), (960, 7, 1)]
# (c_in, c_out, input h = w): MobileNetV2's distinct 1x1 convs (expansions and projections, 224 x 224)
MOBILENET_1X1 = [(32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28),
                 (32, 192, 28), (192, 32, 28), (192, 64, 14), (64, 384, 14), (384, 64, 14), (384, 96, 14),
                 (96, 576, 14), (576, 96, 14), (576, 160, 7), (160, 960, 7), (960, 160, 7), (960, 320, 7),
                 (320, 1280, 7)]
TITLES = {"resnet50_1x1": "the native 1x1 convs (ResNet-50's, batch 32)",
          "mobilenet_v2_1x1": "the native 1x1 convs (MobileNetV2's, batch 1)",
          "mobilenet_v2_depthwise": "the native depthwise convs (MobileNetV2's, batch 1)",
          "resnet_3x3": "the native 3x3 stride-1 convs (ResNet's, batch 1)",
          "models_b1": "whole converted models (batch 1, 224 x 224)"}
RESNET_3X3 = [(64, 56), (128, 28), (256, 14)]  # (channels, input h = w)
MODELS_B1 = ("resnet18", "resnet50", "mobilenet_v2")


def _pointwise_cases(torch, PackedConv2dWeight, layers, batch: int, w_max: int):
    """Per 1x1 conv: {name: call} for the layer alone and with the in-place residual add."""
    cl = torch.channels_last
    for ci, co, hw in layers:
        w = torch.randint(-w_max, w_max + 1, (co, ci, 1, 1), dtype=torch.int8)
        ws, b = torch.rand(co) * 0.01 + 1e-3, torch.randn(co)
        x = torch.randint(0, 256, (batch, ci, hw, hw), dtype=torch.uint8).contiguous(memory_format=cl)
        acc = torch.randint(0, 256, (batch, co, hw, hw), dtype=torch.uint8).contiguous(memory_format=cl)
        pw = PackedConv2dWeight(w, ws, b, (1, 1), (0, 0), (1, 1), 1, "native", x_shape=list(x.shape),
                                x_qparams=(0.02, 128))
        key = f"{ci}->{co} @{hw}"
        yield {key: lambda: pw.conv2d(x, 0.02, 128, 0.1, 128, torch.uint8, "relu"),
               key + " +res": lambda: pw.conv2d_add_(x, 0.02, 128, 0.1, 128, torch.uint8, "relu", acc, 0.05, 128)}


def _depthwise_cases(torch, PackedConv2dWeight):
    """Per MobileNetV2 depthwise conv (batch 1): {name: call}."""
    for c, hw, s in DEPTHWISE:
        w = torch.randint(-127, 128, (c, 1, 3, 3), dtype=torch.int8)
        ws, b = torch.rand(c) * 0.01 + 1e-3, torch.randn(c)
        x = torch.randint(0, 256, (1, c, hw, hw), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        pw = PackedConv2dWeight(w, ws, b, (s, s), (1, 1), (1, 1), c, "native", x_shape=list(x.shape),
                                x_qparams=(0.02, 128))
        yield {f"dw {c} @{hw} s{s}": lambda: pw.conv2d(x, 0.02, 128, 0.1, 0, torch.uint8, "relu")}


def _resnet_3x3_cases(torch, PackedConv2dWeight):
    """Per ResNet 3x3 stride-1 conv (batch 1, 8-bit weights, padding 1): {name: call}."""
    for c, hw in RESNET_3X3:
        w = torch.randint(-128, 128, (c, c, 3, 3), dtype=torch.int8)
        ws, b = torch.rand(c) * 0.01 + 1e-3, torch.randn(c)
        x = torch.randint(0, 256, (1, c, hw, hw), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        pw = PackedConv2dWeight(w, ws, b, (1, 1), (1, 1), (1, 1), 1, "native", x_shape=list(x.shape),
                                x_qparams=(0.02, 128))
        yield {f"3x3 {c} @{hw}": lambda: pw.conv2d(x, 0.02, 128, 0.1, 128, torch.uint8, "relu")}


def _model_cases(torch, qbackend):
    """Per zoo CNN of MODELS_B1: {name: forward at batch 1}, the model quantized with the default
    config on the zoo's calibration batches (the same seeds in every process)."""
    import warnings

    from qbackend.models import MODELS
    from qbackend.models.case import generator
    from qbackend.models.synthetic import synthetic_images

    for name in MODELS_B1:
        case = MODELS[name](batch_size=8, num_calibration_batches=4, num_eval_batches=1, image_size=224, seed=0)
        x = synthetic_images(1, 224, generator(4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = qbackend.quantize(case.model, (x,), case.calibration)
        yield {name: lambda q=q, x=x: q(x)}


def child(threads: int, layers: str) -> None:
    """Times the layer set `layers` (a TITLES key) on the qbackend found first on sys.path
    (benchmarks/_timing.measure, a layer's variants interleaved); prints one JSON line."""
    import torch

    import qbackend
    from _timing import measure
    from qbackend.ops import PackedConv2dWeight

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if layers == "resnet_3x3":
        cases = _resnet_3x3_cases(torch, PackedConv2dWeight)
    elif layers == "models_b1":
        cases = _model_cases(torch, qbackend)
    elif layers == "mobilenet_v2_depthwise":
        cases = _depthwise_cases(torch, PackedConv2dWeight)
    elif layers == "mobilenet_v2_1x1":  # 7-bit weights: the model's on AVX2
        cases = _pointwise_cases(torch, PackedConv2dWeight, MOBILENET_1X1, 1, 64)
    else:
        cases = _pointwise_cases(torch, PackedConv2dWeight, LAYERS, BATCH, 127)
    out = {"qbackend": os.path.dirname(qbackend.__file__)}
    with torch.inference_mode():
        for calls in cases:
            out.update({k: t.min_us for k, t in measure(calls, blocks=8, block_s=0.02).items()})
    print(json.dumps(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", help="folder holding build A's qbackend package")
    ap.add_argument("--b", help="folder holding build B's qbackend package")
    ap.add_argument("--layers", choices=sorted(TITLES), default="resnet50_1x1")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--b-first", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.child:
        child(args.threads, args.layers)
        return 0
    if not (args.a and args.b):
        ap.error("--a and --b are required")
    from _machine import cpu_line, load_average, write_report

    order = ["b", "a"] if args.b_first else ["a", "b"]
    runs = {"a": [], "b": []}
    start_load = load_average()
    for _ in range(args.rounds):
        for side in order:
            env = {**os.environ, "PYTHONPATH": getattr(args, side)}
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--threads", str(args.threads),
                                  "--layers", args.layers],
                                 env=env, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
    keys = [k for k in runs["a"][0] if k != "qbackend"]
    lines = [f"# Two builds on {TITLES[args.layers]}", "", cpu_line(),
             f"- A: `{runs['a'][0]['qbackend']}`; B: `{runs['b'][0]['qbackend']}`",
             f"- threads: {args.threads}; {args.rounds} rounds, each build in a fresh process per round, order "
             f"{' then '.join(s.upper() for s in order)}; date: "
             f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start {start_load}",
             "- us per call: each process's minimum over 8 blocks of about 20 ms (benchmarks/_timing.py), then the "
             "median over the rounds; "
             "uint8 input and output, relu; +res: the in-place int8-residual add (conv2d_add_)",
             f"- command: `python benchmarks/build_ab.py --layers {args.layers} --rounds {args.rounds} "
             f"--threads {args.threads}`", "",
             "| layer | A us | B us | B / A |", "|---|---|---|---|"]
    for k in keys:
        a = statistics.median(r[k] for r in runs["a"])
        b = statistics.median(r[k] for r in runs["b"])
        lines.append(f"| {k} | {a:.0f} | {b:.0f} | {b / a:.2f} |")
    lines += ["", f"Load average at the end: {load_average()}."]
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
