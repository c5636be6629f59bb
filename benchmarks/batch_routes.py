"""Routes by batch size, whole models: each CNN of the zoo converted from batch-8 examples (as
benchmarks/models.py does) twice, with QuantConfig(route_by_batch=True) (the default: a layer whose
best provider changes with the batch holds a packed form per provider and picks per call) and
with route_by_batch=False (one provider per layer, routed at batch 8), timed side by side at batch
1 and 32, interleaved (benchmarks/_timing.py).

    python benchmarks/batch_routes.py [--models resnet18,resnet50,mobilenet_v2] [--batch-sizes 1,32]
                                      [--threads 2] [--blocks 15] [--quick] [--out FILE]

Per model: the layers whose provider changes with the batch (and at which sizes), the int8 weight
bytes of those layers (the upper bound of the extra packed copies), and per batch size the median
and minimum time of both, ratio = one-provider time / routed time (> 1: routing by batch is faster).
Thread pools wait passively (OMP_WAIT_POLICY=PASSIVE, as benchmarks/models.py's default).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qbackend  # noqa: E402
from _machine import cpu_line, git_state, load_average  # noqa: E402
from _timing import measure  # noqa: E402
from qbackend.models import MODELS  # noqa: E402
from qbackend.nn import QuantizedConv2d, QuantizedLinear  # noqa: E402

EXAMPLE_BATCH = 8


def _convert(case, route_by_batch: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qbackend.quantize(case.model, case.example_inputs, case.calibration,
                                 config=qbackend.QuantConfig(route_by_batch=route_by_batch))


def _split_layers(qmodel) -> list[tuple[str, str, int]]:
    out = []
    for name in qmodel.qbackend_layers:
        m = qmodel.layer(name)
        if isinstance(m, (QuantizedConv2d, QuantizedLinear)) and m.packed.batch_routes is not None:
            out.append((name, m.packed.batch_routes.describe(), m.packed.weight.numel()))
    return out


def run(models, batch_sizes, blocks, image_size, log) -> list[str]:
    lines = ["| model | batch | one provider (batch 8's), ms | by batch, ms | ratio (median) | ratio (min) |",
             "|---|---|---|---|---|---|"]
    details = []
    for name in models:
        case = MODELS[name](batch_size=EXAMPLE_BATCH, image_size=image_size, num_calibration_batches=4)
        routed, fixed = _convert(case, True), _convert(case, False)
        split = _split_layers(routed)
        weight = sum(m.packed.weight.numel() for m in routed.modules()
                     if isinstance(m, (QuantizedConv2d, QuantizedLinear)))
        extra = sum(n for _, _, n in split)
        details.append(f"### {name}: {len(split)} of {sum(1 for _ in routed.qbackend_layers)} layers routed by "
                       f"batch size; their int8 weights {extra / 1e6:.2f} MB of {weight / 1e6:.2f} MB\n")
        details += [f"- `{layer}`: {d}" for layer, d, _ in split]
        details.append("")
        for b in batch_sizes:
            x = torch.randn(b, *case.example_inputs[0].shape[1:], generator=torch.Generator().manual_seed(b))
            with torch.no_grad():
                res = measure({"fixed": lambda: fixed(x), "routed": lambda: routed(x)},
                              blocks=blocks, block_s=0.1 if b > 1 else 0.05, budget_s=30)
            f, r = res["fixed"], res["routed"]
            lines.append(f"| {name} | {b} | {f.median_us / 1e3:.2f} (min {f.min_us / 1e3:.2f}) | "
                         f"{r.median_us / 1e3:.2f} (min {r.min_us / 1e3:.2f}) | {f.median_us / r.median_us:.2f} | "
                         f"{f.min_us / r.min_us:.2f} |")
            log(lines[-1])
    return lines + [""] + details


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="ResNet-18 on 64x64 images, batch 1 and 4, 3 rounds")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    models = ["resnet18"] if a.quick else [m.strip() for m in a.models.split(",") if m.strip()]
    batch_sizes = (1, 4) if a.quick else tuple(int(b) for b in a.batch_sizes.split(","))
    head = ["# Routes by batch size: whole models, route_by_batch on vs off", "", cpu_line(),
            f"- threads: {a.threads}; torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()}); "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average at start "
            f"{load_average()}",
            f"- models converted from batch-{EXAMPLE_BATCH} examples (4 calibration batches), "
            f"{'64x64' if a.quick else '224x224'} images; times per call, median over {a.blocks} interleaved "
            "blocks (min: the least disturbed block)", ""]
    print("\n".join(head), flush=True)
    body = run(models, batch_sizes, 3 if a.quick else a.blocks, 64 if a.quick else 224,
               lambda s: print(s, flush=True))
    text = "\n".join(head + body + [f"Load average at the end: {load_average()}.", ""])
    print("\n".join(body))
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
