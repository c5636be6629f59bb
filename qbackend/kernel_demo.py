"""`qbackend demo` (until the prepare/convert flow lands): quantize one FP32 Linear layer with
per-channel symmetric int8 weights and a per-tensor uint8 activation, run it through each
provider, and print its accuracy (SQNR against FP32) and speed next to FP32 and BF16.
"""
from __future__ import annotations

import time

import torch

from .dispatch import cpu_features, rules
from .ops import PROVIDERS, PackedLinearWeight, quantize


def _sqnr_db(ref: torch.Tensor, y: torch.Tensor) -> float:
    err = (ref.double() - y.double()).pow(2).sum()
    return float(10 * torch.log10(ref.double().pow(2).sum() / err)) if err > 0 else float("inf")


def _time_us(fn, iters: int = 50, blocks: int = 5) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def run(batch: int = 64, features: int = 768, seed: int = 0) -> int:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(features, features).eval()
    x = torch.randn(batch, features)
    feats = cpu_features()
    with torch.no_grad():
        ref = layer(x)
        w = layer.weight
        w_scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
        w_q = quantize(w, w_scales, 0, torch.int8, axis=0)
        qmax = 255 if feats.has_vnni else 127  # 7-bit activations where u8 x s8 would saturate
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        x_scale = (hi - lo) / qmax
        x_zp = int(round(-lo / x_scale))
        x_q = quantize(x, x_scale, x_zp, torch.uint8)
        wbf, xbf = w.to(torch.bfloat16), x.to(torch.bfloat16)
        rows = [("FP32", _time_us(lambda: torch.nn.functional.linear(x, w, layer.bias)), float("inf")),
                ("BF16", _time_us(lambda: torch.nn.functional.linear(xbf, wbf, layer.bias.to(torch.bfloat16))),
                 _sqnr_db(ref, torch.nn.functional.linear(xbf, wbf, layer.bias.to(torch.bfloat16))))]
        for name in PROVIDERS:
            if name == "reference":
                continue
            pw = PackedLinearWeight(w_q, w_scales, layer.bias, provider=name, x_shape=[batch, features])
            y = pw.linear(x_q, x_scale, x_zp)
            rows.append((f"INT8 {name}", _time_us(lambda: pw.linear(x_q, x_scale, x_zp)), _sqnr_db(ref, y)))
    rule = rules.choose("linear", feats.isa_class, {"m": batch, "k": features, "n": features})
    print(f"Linear {features}x{features}, batch {batch}, {torch.get_num_threads()} threads, "
          f"CPU class {feats.isa_class}; rule picks {rule.provider} ({rule.condition})")
    print("| path | time (us) | speed-up vs FP32 | SQNR vs FP32 (dB) |")
    print("|---|---|---|---|")
    fp32 = rows[0][1]
    for name, t, sqnr in rows:
        print(f"| {name} | {t:.1f} | {fp32 / t:.2f}x | {'exact' if sqnr == float('inf') else f'{sqnr:.1f}'} |")
    return 0
