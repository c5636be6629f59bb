"""`qbackend info`: the probed CPU features, the ISA override, and where representative op
instances would run here (qbackend.dispatch.route). `qbackend info FILE`: a saved model's file
described without building the model (serialization.inspect_file)."""
from __future__ import annotations

import argparse
import os

import torch

from ..core.extension import _C
from ..core.version import VERSION
from ..dispatch import cpu_features, fbgemm_isa, route
from ..dispatch.routing import exact_route_exists, seven_bit_speedup, seven_bit_weights
from ..observers import default_reduce_range
from ..serialization import inspect_file

REPRESENTATIVE = {
    "linear": [
        ("M=1 (one token), 768x768", {"m": 1, "k": 768, "n": 768}),
        ("M=16, 768x3072", {"m": 16, "k": 768, "n": 3072}),
        ("M=1024 (8x128 tokens), 768x768", {"m": 1024, "k": 768, "n": 768}),
    ],
    "conv2d": [
        ("ResNet-50 3x3, 64ch @56", {"n": 1, "c_in": 64, "c_out": 64, "h": 56, "w": 56, "kernel": (3, 3),
                                     "stride": 1, "padding": (1, 1), "groups": 1}),
        ("ResNet-50 1x1, 256->64 @56", {"n": 1, "c_in": 256, "c_out": 64, "h": 56, "w": 56, "kernel": (1, 1),
                                        "stride": 1, "padding": (0, 0), "groups": 1}),
        ("MobileNetV2 depthwise 3x3, 144ch @56", {"n": 1, "c_in": 144, "c_out": 144, "h": 56, "w": 56,
                                                  "kernel": (3, 3), "stride": 1, "padding": (1, 1),
                                                  "groups": 144}),
        ("ResNeXt grouped 3x3, g=32 x 4ch @56", {"n": 1, "c_in": 128, "c_out": 128, "h": 56, "w": 56,
                                                 "kernel": (3, 3), "stride": 1, "padding": (1, 1),
                                                 "groups": 32}),
    ],
    "attention": [("an encoder's attention core (SDPA in the graph)", {})],
    "embedding_bag": [
        ("1M x 64 table, 8-bit, fp16 scale/bias", {"rows": 1 << 20, "dim": 64, "bits": 8, "fp16_qparams": 1,
                                                   "padding_idx": 0}),
        ("the same with padding_idx", {"rows": 1 << 20, "dim": 64, "bits": 8, "fp16_qparams": 1, "padding_idx": 1}),
    ],
}


def _bf16_line() -> str:
    """Whether bf16 dot products pay here (measured), hence the attention cores' default."""
    if not _C.bf16_usable():
        return "bf16 products: no AVX512-BF16; attention cores: torch SDPA (QuantConfig(attention='auto'))"
    fma, dot = _C.fma_gflops(), _C.bf16_dot_gflops()
    pays = _C.bf16_products_pay()
    return (f"bf16 products: fp32 FMA {fma:.0f} GFLOP/s, bf16 dot {dot:.0f} GFLOP/s per thread (policy "
            f"{_C.bf16_products_policy()}): {'they pay' if pays else 'they do not pay'}; attention cores: "
            f"{'fused (qbackend::attention)' if pays else 'torch SDPA'} (QuantConfig(attention='auto'))")


def run_file(path: str) -> int:
    d = inspect_file(path)
    saved = d.get("saved_on") or {}
    print(f"{path}: qbackend model format {d['version']}" + (" (pickled: loads only with allow_pickle=True; "
          "`qbackend upgrade` rewrites it)" if d["pickled"] else " (safetensors + JSON, loads without running code)"))
    print(f"written by qbackend {d.get('qbackend_version')} with torch {d.get('torch_version')} on "
          f"{saved.get('model') or '?'} ({saved.get('vendor') or '?'}, {saved.get('isa_class') or '?'})")
    if d["tensors"] is not None:
        print(f"tensors: {d['tensors']} ({d['tensor_bytes']:,} bytes), checksums verified")
    if d.get("classes"):
        print(f"classes outside qbackend and torch.nn (pass them to qbackend.load(classes=...)): "
              f"{', '.join(d['classes'])}")
    rows = d.get("layers") or []
    if rows:
        keys = ["layer", "op", "mode", "shape", "provider"]
        keys = [k for k in keys if any(k in r for r in rows)]
        print()
        print("| " + " | ".join(keys) + " |  (routes as saved; `qbackend explain FILE` routes them for this CPU)")
        print("|" + "---|" * len(keys))
        for r in rows:
            print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "path", None):
        return run_file(args.path)
    f = cpu_features()
    seven = default_reduce_range(torch.uint8)
    print(f"qbackend {VERSION}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    print(f"CPU: {f.model_name or '?'} ({f.vendor})")
    print(f"override: QBACKEND_ISA={f.override}" if f.override else "override: none (QBACKEND_ISA unset)")
    print(f"ISA in use: {f.level_name} (dispatch class {f.isa_class}); FBGEMM: {fbgemm_isa()}; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset (all)')}")
    print(_bf16_line())
    print()
    print("| feature | CPU has it | OS allows it |")
    print("|---|---|---|")
    for name, feat in f.features().items():
        print(f"| {name} | {'yes' if feat.cpu else 'no'} | {'yes' if feat.os else 'no'} |")
    print()
    print(f"Routes on this CPU class ({f.isa_class}), for activations as the default observers quantize them "
          f"({'7' if seven else '8'}-bit):")
    print("| op | shape | provider | why |")
    print("|---|---|---|---|")
    for op, shapes in REPRESENTATIVE.items():
        for label, shape in shapes:
            # 8-bit unless the observers use 7 bits, this layer has no exact 8-bit route here, or a static
            # layer's 7-bit route is in the 7-bit table (its input then gets a 7-bit observer:
            # lowering/prepare.py, QuantConfig.seven_bit_for_speed)
            exact = op != "embedding_bag" and exact_route_exists(op, shape)
            faster = op in ("linear", "conv2d") and seven_bit_speedup(op, shape) is not None
            eight = exact and not seven and not faster
            r = route(op, shape, eight_bit_input=eight)
            note = "" if eight or seven or op == "embedding_bag" else (
                " (7-bit input for a static layer: over 1.5x faster here, QuantConfig.seven_bit_for_speed)"
                if exact else " (7-bit input: no exact 8-bit route here)")
            weights = seven_bit_weights(op, shape, r) if op in ("linear", "conv2d") and eight else None
            if weights is not None:
                note += f"; 7-bit weights for a static layer: {weights.describe} (QuantConfig.seven_bit_for_speed)"
            print(f"| {op} | {label} | {r.provider} | {r.why}{note} |")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="probed CPU features, ISA override, and the provider each op kind would use; "
                                    "with FILE, a saved model's file (versions, CPU, layers), not built")
    p.add_argument("path", nargs="?", help="a file written by qbackend.save")
