"""7-bit weights on AVX2 without VNNI: the native GEMM's pair-product kernel against its int16 one,
layer by layer, and what QuantConfig.seven_bit_for_speed's 7-bit weights (rules.SEVEN_BIT_WEIGHTS)
do to the zoo CNNs' speed and accuracy.

    python benchmarks/seven_bit_weights.py [--threads 1,2] [--models resnet18,resnet50,mobilenet_v2,digits_cnn]
                                           [--batches 1,32] [--out benchmarks/results/<cpu>/kernels_avx2_pairs.md]

Layers: each layer is quantized alone (a ReLU before it, so its input is a post-ReLU activation
as in the CNNs) with weights on the 7-bit grid [-64, 64]; the same module is timed on the AVX2
kernel's int16 products (`set_native_kernel("avx2_int16")`) and on its pair products (the default
for such weights), interleaved (`_timing.measure`), and the two outputs compared (identical: both
exact). Models: each model quantized with the default config (7-bit weights where the table says)
and with `seven_bit_for_speed=False` (8-bit weights), the two timed interleaved; SQNR of each
against FP32 on a held-out batch. Needs an AVX2 CPU; on a CPU with VNNI the rows run under the
AVX2 kernel (QBACKEND_ISA=avx2 gives the model part its AVX2 rules).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import qbackend  # noqa: E402
from _machine import run_lines, load_average, write_report  # noqa: E402
from _timing import measure  # noqa: E402
from qbackend.config import ObserverSpec, QuantConfig  # noqa: E402
from qbackend.core.extension import _C  # noqa: E402
from qbackend.models import MODELS  # noqa: E402

W7 = QuantConfig(weight=ObserverSpec("per_channel_minmax", {"dtype": torch.int8, "symmetric": True, "axis": 0,
                                                            "qmin": -64, "qmax": 64}))
CONVS = [("r18/50 3x3 64 @56", 64, 64, 56, 3, 1), ("r18 3x3 128 @28", 128, 128, 28, 3, 1),
         ("r18 3x3 256 @14", 256, 256, 14, 3, 1), ("r18 3x3 512 @7", 512, 512, 7, 3, 1),
         ("r18 3x3/2 64->128 @56", 64, 128, 56, 3, 2), ("r50 1x1 256->64 @56", 256, 64, 56, 1, 1),
         ("r50 1x1 64->256 @56", 64, 256, 56, 1, 1), ("r50 1x1 1024->256 @14", 1024, 256, 14, 1, 1),
         ("mv2 1x1 96->24 @56", 96, 24, 56, 1, 1), ("mv2 1x1 32->192 @28", 32, 192, 28, 1, 1),
         ("mv2 1x1 576->160 @7", 576, 160, 7, 1, 1)]
LINEARS = [(256, 256), (512, 1000), (768, 768), (768, 3072), (3072, 768)]
ROWS = [1, 4, 8, 16, 32, 128]


def _layer_module(layer: nn.Module, x: torch.Tensor):
    """The quantized module of `layer` (7-bit weights) and its int8 input."""
    model = nn.Sequential(nn.ReLU(), layer, nn.ReLU()).eval()
    g = torch.Generator().manual_seed(0)
    cal = [(torch.randn(x.shape, generator=g),) for _ in range(2)]
    q = qbackend.quantize(model, (x,), cal, config=W7)
    q.forward_plans = False
    mod = dict(q.named_modules())[[n for n, _ in q.named_modules() if n.endswith(".1")][0]]
    cap = {}
    hook = mod.register_forward_hook(lambda m, a, o: cap.setdefault("a", a) and None)
    with torch.no_grad():
        q(x)
    hook.remove()
    return mod, cap["a"]


def _row(mod, args) -> tuple[float, float, bool]:
    outs = {}

    def run(kernel):
        def call():
            _C.set_native_kernel(kernel)
            outs[kernel] = mod(*args)
        return call

    with torch.inference_mode():
        t = measure({"avx2_int16": run("avx2_int16"), "avx2": run("avx2")}, blocks=15, block_s=0.01)
    _C.set_native_kernel("")
    return t["avx2_int16"].min_us, t["avx2"].min_us, torch.equal(outs["avx2_int16"], outs["avx2"])


def layer_tables(threads: list[int]) -> list[str]:
    lines = []
    for th in threads:
        torch.set_num_threads(th)
        lines += ["", f"### Layers, batch 1, {th} thread{'s' if th > 1 else ''}", "",
                  "| layer | shape | int16 products us | pair products us | speed-up | outputs identical |",
                  "|---|---|---|---|---|---|"]
        for name, c, oc, hw, k, s in CONVS:
            torch.manual_seed(0)
            mod, args = _layer_module(nn.Conv2d(c, oc, k, stride=s, padding=k // 2), torch.randn(1, c, hw, hw))
            t16, tp, same = _row(mod, args)
            lines.append(f"| {name} | {c}->{oc} {k}x{k}/{s} @{hw} | {t16:.1f} | {tp:.1f} | {t16 / tp:.2f}x | {same} |")
        for kk, nn_ in LINEARS:
            for m in ROWS:
                torch.manual_seed(0)
                mod, args = _layer_module(nn.Linear(kk, nn_), torch.randn(m, kk))
                t16, tp, same = _row(mod, args)
                lines.append(f"| linear | {kk}x{nn_}, M = {m} | {t16:.1f} | {tp:.1f} | {t16 / tp:.2f}x | {same} |")
    return lines


def _sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum()))


def model_table(models: list[str], batches: list[int], threads: int) -> list[str]:
    torch.set_num_threads(threads)
    lines = ["", f"### Models, {threads} threads (ms per forward, min over interleaved blocks)", "",
             "| model | batch | 8-bit weights ms | 7-bit weights ms | speed-up | SQNR 8-bit w | SQNR 7-bit w |",
             "|---|---|---|---|---|---|---|"]
    for name in models:
        kw = {} if name == "digits_cnn" else {"image_size": 224}
        case = MODELS[name](batch_size=8, num_calibration_batches=4, num_eval_batches=1, seed=0, **kw)
        x1 = case.calibration[0][0][:1]
        quantized = {"8-bit": qbackend.quantize(case.model, (x1,), case.calibration,
                                                config=QuantConfig(seven_bit_for_speed=False)),
                     "7-bit": qbackend.quantize(case.model, (x1,), case.calibration)}
        ev = case.evaluation[0][0]
        with torch.no_grad():
            ref = case.output(case.model(ev))
            sq = {k: _sqnr(ref, case.output(q(ev))) for k, q in quantized.items()}
        for b in batches:
            x = torch.cat([ev] * (-(-b // ev.shape[0])))[:b]
            with torch.inference_mode():
                t = measure({k: (lambda q=q: q(x)) for k, q in quantized.items()}, blocks=9, block_s=0.2,
                            budget_s=6.0)
            t8, t7 = t["8-bit"].min_us / 1e3, t["7-bit"].min_us / 1e3
            lines.append(f"| {name} | {b} | {t8:.2f} | {t7:.2f} | {t8 / t7:.2f}x | {sq['8-bit']:.1f} | {sq['7-bit']:.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,digits_cnn")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--skip-layers", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not _C.native_isa():
        sys.exit("needs an AVX2 CPU (the native GEMM)")
    threads = [int(v) for v in args.threads.split(",")]
    t0 = time.time()
    lines = ["# 7-bit weights on AVX2: the native GEMM's pair products", ""] + run_lines(threads) + [
        f"- command: `python benchmarks/seven_bit_weights.py {' '.join(sys.argv[1:])}`".rstrip(),
        "- layers: min us per call over 15 interleaved blocks; models: min ms per forward over 9 interleaved blocks "
        "of 0.2 s; SQNR in dB against FP32 on a held-out batch", ""]
    if not args.skip_layers:
        lines += ["## Layers (7-bit weights: int16 products against pair products, the same module)"]
        lines += layer_tables(threads)
    if args.models:
        lines += ["", "## Models (default config: 7-bit weights where rules.SEVEN_BIT_WEIGHTS lists the layer; "
                  "against seven_bit_for_speed=False)"]
        lines += model_table(args.models.split(","), [int(b) for b in args.batches.split(",")], max(threads))
    lines += ["", f"Total time: {time.time() - t0:.0f} s; load average at the end {load_average()}."]
    write_report("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
