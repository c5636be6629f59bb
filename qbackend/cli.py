"""The `qbackend` command line (also `python -m qbackend`): `info`, `explain` and `demo` (qbackend.demo)."""
from __future__ import annotations

import argparse
import os
import sys

REPRESENTATIVE = {
    "linear": [
        ("M=1 (one token), 768x768", {"m": 1, "k": 768, "n": 768}),
        ("M=16, 768x3072", {"m": 16, "k": 768, "n": 3072}),
        ("M=1024 (8x128 tokens), 768x768", {"m": 1024, "k": 768, "n": 768}),
    ],
    "conv2d": [
        ("ResNet-50 3x3, 64ch @56", {"n": 1, "c_in": 64, "c_out": 64, "h": 56, "w": 56, "kernel": (3, 3),
                                     "stride": 1, "groups": 1}),
        ("MobileNetV2 depthwise 3x3, 144ch @56", {"n": 1, "c_in": 144, "c_out": 144, "h": 56, "w": 56,
                                                  "kernel": (3, 3), "stride": 1, "groups": 144}),
        ("ResNeXt grouped 3x3, g=32 x 4ch @56", {"n": 1, "c_in": 128, "c_out": 128, "h": 56, "w": 56,
                                                 "kernel": (3, 3), "stride": 1, "groups": 32}),
    ],
}


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    import qbackend
    from qbackend.dispatch import cpu_features, fbgemm_isa, rules

    f = cpu_features()
    print(f"qbackend {qbackend.__version__}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    print(f"CPU: {f.model_name or '?'} ({f.vendor})")
    print(f"override: QBACKEND_ISA={f.override}" if f.override else "override: none (QBACKEND_ISA unset)")
    print(f"ISA in use: {f.level_name} (dispatch class {f.isa_class}); FBGEMM: {fbgemm_isa()}; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset (all)')}")
    print()
    print("| feature | CPU has it | OS allows it |")
    print("|---|---|---|")
    for name, feat in f.features().items():
        print(f"| {name} | {'yes' if feat.cpu else 'no'} | {'yes' if feat.os else 'no'} |")
    print()
    print(f"Routes on this CPU class ({f.isa_class}):")
    print("| op | shape | provider | rule |")
    print("|---|---|---|---|")
    for op, shapes in REPRESENTATIVE.items():
        for label, shape in shapes:
            rule = rules.choose(op, f.isa_class, shape)
            print(f"| {op} | {label} | {rule.provider} | {rule.condition}: {rule.why} |")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    import warnings

    import qbackend

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qmodel = qbackend.load(args.path)
    saved = getattr(qmodel, "qbackend_saved_on", None) or {}
    f = qbackend.cpu_features()
    print(f"{args.path}: saved on {saved.get('model') or '?'} ({saved.get('isa_class', '?')}); "
          f"routed here for {f.model_name or '?'} ({f.isa_class})")
    for w in caught:
        if type(w.message).__module__.startswith("qbackend"):
            print(f"note: {w.message}")
    print(qbackend.explain(qmodel).to_markdown())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import json

    from qbackend.demo import format_demo, run_demo

    batch_sizes = _int_list(args.batch, "--batch")
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else None
    result = run_demo(batch_sizes=batch_sizes, threads=args.threads, rounds=args.rounds, epochs=args.epochs, log=log)
    print(format_demo(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{option} takes positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qbackend", description="x86 INT8 quantization backend for PyTorch")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="probed CPU features, ISA override, and the provider each op kind would use")
    e = sub.add_parser("explain", help="per layer of a saved model (qbackend.save): op, shapes, provider, why")
    e.add_argument("path", help="a file written by qbackend.save")
    d = sub.add_parser("demo", help="train a small CNN on scikit-learn's digits, quantize it, and compare FP32 "
                                    "with INT8: top-1, latency, size, where each layer runs")
    d.add_argument("--batch", default="1,32", help="batch sizes to time, comma-separated (default 1,32)")
    d.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    d.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds per batch size (default 40)")
    d.add_argument("--epochs", type=int, default=15, help="training epochs (default 15)")
    d.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    d.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"info": cmd_info, "explain": cmd_explain, "demo": cmd_demo}[args.command](args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"qbackend {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
