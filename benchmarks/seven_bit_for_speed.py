"""QuantConfig.seven_bit_for_speed on this CPU: each zoo model quantized twice (the default, which
gives 7-bit inputs to the layers of the 7-bit table, and seven_bit_for_speed=False, 8 bits wherever
they are exact), output SQNR against FP32 and forward time, the two models timed interleaved.

    python benchmarks/seven_bit_for_speed.py [resnet18,resnet50,mobilenet_v2]

On a CPU with VNNI the two models are the same (the table has rows for AVX2 only)."""
import statistics
import sys
import time
import warnings

import torch

import qbackend
from models import Sizes, build_bench

ROUNDS, BLOCK_S = 15, 0.2


def sqnr(ref, out):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum()))


def main(names):
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(f"CPU class {qbackend.cpu_features().isa_class}; torch {torch.__version__}; 2 threads")
    for name in names:
        bench = build_bench(name, Sizes(), 2, "/tmp")
        model = bench.fresh_model()
        qs = {}
        for tag, cfg in (("8-bit", qbackend.QuantConfig(seven_bit_for_speed=False)), ("default", None)):
            t0 = time.perf_counter()
            qs[tag] = qbackend.quantize(bench.fresh_model(), bench.example, bench.calibration, config=cfg)
            print(name, tag, "quantize", round(time.perf_counter() - t0, 2), "s", flush=True)
        for b, inp in bench.inputs.items():
            with torch.no_grad():
                ref = model(*inp)
                for tag, q in qs.items():
                    print(name, f"b{b}", tag, "SQNR", round(sqnr(ref, q(*inp)), 2))
                times = {t: [] for t in qs}
                for q in qs.values():
                    for _ in range(3):
                        q(*inp)
                for _ in range(ROUNDS):
                    for tag, q in qs.items():
                        t0, n = time.perf_counter(), 0
                        while time.perf_counter() - t0 < BLOCK_S:
                            q(*inp)
                            n += 1
                        times[tag].append((time.perf_counter() - t0) / n)
                med = {t: statistics.median(v) for t, v in times.items()}
                print(name, f"b{b}", {t: f"{v * 1e3:.2f} ms" for t, v in med.items()}, "speed-up",
                      round(med["8-bit"] / med["default"], 2), flush=True)
        for tag, q in qs.items():
            provs = [r["provider"] for r in qbackend.explain(q)]
            print(name, tag, {p: provs.count(p) for p in sorted(set(provs))})


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["resnet18", "resnet50", "mobilenet_v2"])
