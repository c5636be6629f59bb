"""qbackend as a Hugging Face quantization method (qbackend.hf): `from_pretrained(...,
quantization_config=QBackendConfig(...))` quantizes a random-init Llama-style causal LM and BERT
encoders built from configs exactly as qbackend.quantize_llm does, `save_pretrained` writes
safetensors and JSON only, and `from_pretrained(saved_dir)` gives the same model back (outputs,
generation, the quantized modules) after a plain `import qbackend`; bad configs and hand-edited folders
get errors naming what is wrong."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import qbackend
from qbackend.llm.checkpoint import CheckpointError
from qbackend.nn import Int4WeightOnlyLinear, QuantizedEmbedding, WeightOnlyLinear
from tests.subprocess_utils import run_example, run_py

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from qbackend.hf import QBackendConfig  # noqa: E402  (needs transformers)

SCHEMES = {
    "int8": dict(),
    "w8a8": dict(activations="int8"),
    "int4": dict(weights="int4"),
    "w4a8_g64_sym_int4_head": dict(weights="int4", activations="int8", group_size=64, symmetric=True, lm_head="int4"),
    "int8_embedding": dict(embedding="int8"),
}


def _llama(tied: bool):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg).eval()


def _bert(cls):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    return cls(cfg).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Float checkpoints saved by transformers: {name: (folder, the float model)}."""
    root = tmp_path_factory.mktemp("hf")
    models = {"llama": _llama(tied=False), "llama_tied": _llama(tied=True),
              "bert": _bert(transformers.BertModel), "bert_mlm": _bert(transformers.BertForMaskedLM)}
    out = {}
    for name, model in models.items():
        model.save_pretrained(root / name)
        out[name] = (root / name, model)
    return out


IDS = torch.tensor([[3, 17, 250, 9, 101, 44, 7]])


def _auto(name):
    return {"llama": transformers.AutoModelForCausalLM, "llama_tied": transformers.AutoModelForCausalLM,
            "bert": transformers.AutoModel, "bert_mlm": transformers.AutoModelForMaskedLM}[name]


def _out(model, ids=IDS):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _own_api(folder, name, settings):
    """The same float checkpoint quantized by qbackend's own API."""
    model = _auto(name).from_pretrained(folder)
    return qbackend.quantize_llm(model, qbackend.LLMConfig(**settings))


def _saved_files(folder) -> set[str]:
    return {f for f in os.listdir(folder)}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("name", ["llama", "llama_tied"])
def test_causal_lm_quantized_on_load_saved_and_reloaded(folders, tmp_path, name, scheme):
    folder, fp32 = folders[name]
    settings = SCHEMES[scheme]
    model = _auto(name).from_pretrained(folder, quantization_config=QBackendConfig(**settings))
    assert type(model) is transformers.LlamaForCausalLM  # still the HF model object
    expected = Int4WeightOnlyLinear if settings.get("lm_head") == "int4" else WeightOnlyLinear
    assert type(model.lm_head) is expected
    assert model.qbackend_llm["native_layers"] == ["model.layers.0", "model.layers.1"]
    assert model.qbackend_llm["decoding_step"] == "model" and isinstance(model.model, transformers.LlamaModel)
    out = _out(model)
    own = _own_api(folder, name, settings)
    assert torch.equal(out, _out(own)), "from_pretrained must equal qbackend.quantize_llm with the same settings"
    assert not torch.equal(out, _out(fp32)) and torch.allclose(out, _out(fp32), atol=0.5)

    model.save_pretrained(tmp_path / "q")
    files = _saved_files(tmp_path / "q")
    assert files == {"model.safetensors", "config.json", "generation_config.json"}, files
    saved = safetensors_torch.load_file(tmp_path / "q" / "model.safetensors")
    assert saved["model.layers.0.self_attn.k_proj." + ("weight_int4" if settings.get("weights") == "int4"
                                                        else "weight_int8")].dtype in (torch.int8, torch.uint8)
    assert not any(k.endswith((".weight_tiles", ".scale_tiles")) or ".fused." in k for k in saved)
    assert "model.layers.0.self_attn.k_proj.weight" not in saved
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "qbackend" and len(config["quantized_modules"]) == \
        15 + bool(settings.get("embedding"))

    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert torch.equal(_out(loaded), out)
    assert loaded.qbackend_llm == model.qbackend_llm
    if settings.get("embedding"):
        assert type(loaded.model.embed_tokens) is QuantizedEmbedding
    greedy = model.generate(IDS, max_new_tokens=6, do_sample=False)
    assert torch.equal(loaded.generate(IDS, max_new_tokens=6, do_sample=False), greedy)
    torch.manual_seed(5)
    sampled = model.generate(IDS, max_new_tokens=6, do_sample=True, top_k=20)
    torch.manual_seed(5)
    assert torch.equal(loaded.generate(IDS, max_new_tokens=6, do_sample=True, top_k=20), sampled)
    beams = loaded.generate(IDS, max_new_tokens=4, num_beams=3, do_sample=False)
    assert beams.shape == (1, IDS.shape[1] + 4)


@pytest.mark.parametrize("name", ["bert", "bert_mlm"])
@pytest.mark.parametrize("scheme", ["int8", "w8a8", "int4"])
def test_encoder_quantized_on_load_saved_and_reloaded(folders, tmp_path, name, scheme):
    folder, fp32 = folders[name]
    settings = SCHEMES[scheme]
    model = _auto(name).from_pretrained(folder, quantization_config=QBackendConfig(**settings))
    assert type(model) is type(fp32)
    assert model.qbackend_llm["fused"], "the query, key and value projections read one input"
    out = _out(model)
    assert torch.equal(out, _out(_own_api(folder, name, settings)))
    assert not torch.equal(out, _out(fp32)) and torch.allclose(out, _out(fp32), atol=0.5)
    model.save_pretrained(tmp_path / "q")
    assert _saved_files(tmp_path / "q") == {"model.safetensors", "config.json"}
    loaded = _auto(name).from_pretrained(tmp_path / "q")
    assert torch.equal(_out(loaded), out)
    assert loaded.qbackend_llm == model.qbackend_llm


def test_gptq_calibration_is_used_and_not_saved(folders, tmp_path):
    folder, _ = folders["llama"]
    calibration = torch.randint(0, 320, (4, 32), generator=torch.Generator().manual_seed(2))
    config = QBackendConfig(weights="int4", calibration=calibration)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config)
    assert model.qbackend_llm["gptq"], "4-bit weights with calibration take GPTQ's rounding"
    own = qbackend.quantize_llm(transformers.AutoModelForCausalLM.from_pretrained(folder),
                                qbackend.LLMConfig(weights="int4"), calibration=calibration)
    assert torch.equal(_out(model), _out(own))
    model.save_pretrained(tmp_path / "q")
    saved = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert "calibration" not in saved
    assert {n for n, s in saved["quantized_modules"].items() if s.get("rounding") == "gptq"} == \
        set(model.qbackend_llm["gptq"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert torch.equal(_out(loaded), _out(model)) and loaded.qbackend_llm["gptq"] == model.qbackend_llm["gptq"]


def test_modules_to_not_convert_stay_float_across_a_reload(folders, tmp_path):
    folder, _ = folders["llama"]
    config = QBackendConfig(modules_to_not_convert=["model.layers.1.mlp", "lm_head"])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config)
    assert type(model.model.layers[1].mlp.down_proj) is torch.nn.Linear and type(model.lm_head) is torch.nn.Linear
    model.save_pretrained(tmp_path / "q")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert type(loaded.model.layers[1].mlp.down_proj) is torch.nn.Linear
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(_out(loaded), _out(model))
    assert loaded.qbackend_llm["float"] == model.qbackend_llm["float"]


@pytest.mark.parametrize("order", ["qbackend first", "transformers first"])
def test_a_plain_import_of_qbackend_registers_the_method(folders, tmp_path, order):
    folder, _ = folders["llama"]
    transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig()).save_pretrained(
        tmp_path / "q")
    imports = ["import qbackend", "import transformers"]
    if order == "transformers first":
        imports.reverse()
    code = "; ".join(imports) + (
        "; import sys; assert 'transformers.modeling_utils' not in sys.modules or 'qbackend.hf' in sys.modules"
        f"; m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'q')!r})"
        "; print(type(m.lm_head).__name__, type(m.model.layers[0]).__name__)")
    out = run_py(code, check=True).stdout
    assert out.split()[-2:] == ["WeightOnlyLinear", "NativeLlamaDecoderLayer"], out


def test_import_qbackend_does_not_import_transformers():
    out = run_py("import sys, qbackend; print('transformers' in sys.modules)", check=True).stdout
    assert out.strip() == "False"


def test_config_round_trips_through_its_dict():
    config = QBackendConfig(weights="int4", activations="int8", group_size=128, symmetric=True,
                            modules_to_not_convert=["lm_head"])
    again = QBackendConfig.from_dict(json.loads(config.to_json_string()))
    assert again.to_dict() == config.to_dict()
    assert again.llm_config() == qbackend.LLMConfig(weights="int4", activations="int8", group_size=128,
                                                     symmetric=True, skip=("lm_head",))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(weights="int3"), ValueError, "weights must be one of"),
    (dict(activations="fp8"), ValueError, "activations must be one of"),
    (dict(weights="int4", group_size=48), ValueError, "group_size must be one of"),
    (dict(group_size=32), ValueError, "group_size and symmetric apply to weights='int4'"),
    (dict(lm_head="int2"), ValueError, "lm_head must be"),
    (dict(modules_to_not_convert="lm_head"), TypeError, "modules_to_not_convert must be a list"),
    (dict(quant_method="torchao"), ValueError, "quant_method must be 'qbackend'"),
    (dict(format_version=99), ValueError, "format_version 99"),
    (dict(bits=4), TypeError, "unknown fields ['bits']"),
])
def test_bad_configs_are_refused_naming_the_field(kwargs, error, words):
    with pytest.raises(error) as info:
        QBackendConfig(**kwargs)
    assert words in str(info.value)


def test_a_model_with_nothing_to_quantize_is_refused(folders):
    folder, _ = folders["llama"]
    with pytest.raises(ValueError, match="no nn.Linear to quantize"):
        transformers.AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=QBackendConfig(modules_to_not_convert=["model", "lm_head"]))


@pytest.mark.parametrize("device_map", [{"": "cuda:0"}, "cuda", {"model": "cpu", "lm_head": "disk"}])
def test_the_quantizer_refuses_a_device_map_off_the_cpu(device_map):
    from qbackend.hf import QBackendHfQuantizer

    quantizer = QBackendHfQuantizer(QBackendConfig(), pre_quantized=False)
    quantizer.validate_environment(device_map={"": "cpu"})
    with pytest.raises(ValueError, match="qbackend runs on the CPU: device_map"):
        quantizer.validate_environment(device_map=device_map)


def test_a_device_map_off_the_cpu_is_refused(folders):
    pytest.importorskip("accelerate")  # without it transformers refuses any device_map itself
    folder, _ = folders["llama"]
    with pytest.raises(ValueError, match="qbackend runs on the CPU: device_map"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig(),
                                                          device_map={"": "cuda:0"})


K = "model.layers.0.self_attn.q_proj"


def _edit_tensor(key, fn):
    def edit(state, config):
        if fn is None:
            del state[key]
        else:
            state[key] = fn(state[key])
    return edit


def _edit_config(fn):
    return lambda state, config: fn(config["quantization_config"])


EDITS = {
    "weight stored as float": (_edit_tensor(K + ".weight_int8", lambda t: t.float()), CheckpointError,
                               "must be torch.int8 [64, 64] as its spec says; the file holds F32"),
    "weight missing": (_edit_tensor(K + ".weight_int8", None), CheckpointError,
                       f"the checkpoint has no tensor {K}.weight_int8"),
    "weight cut short": (_edit_tensor(K + ".weight_int8", lambda t: t[:5]), CheckpointError, "the file holds I8 [5, 64]"),
    "scale not finite": (_edit_tensor(K + ".weight_scale", lambda t: t * float("nan")), CheckpointError,
                         "weight_scale has NaN or infinite values"),
    "spec with another shape": (_edit_config(lambda c: c["quantized_modules"][K].update(in_features=65)),
                                CheckpointError, "is an nn.Linear(65, 64, bias=False); the model has"),
    "spec of an unknown kind": (_edit_config(lambda c: c["quantized_modules"][K].update(kind="int2")),
                                CheckpointError, "kind is one of int8, int4, embedding"),
    "spec of a module the model lacks": (
        _edit_config(lambda c: c["quantized_modules"].update({"model.extra": c["quantized_modules"][K]})),
        CheckpointError, "model.extra"),
    "unknown field": (_edit_config(lambda c: c.update(bits=4)), TypeError, "unknown fields ['bits']"),
    "no module specs": (_edit_config(lambda c: c.pop("quantized_modules")), ValueError, "lists no quantized_modules"),
    "unknown scheme": (_edit_config(lambda c: c.update(weights="int3")), ValueError, "weights must be one of"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_hand_edited_folder_is_refused_with_a_clear_error(folders, tmp_path, edit):
    folder, _ = folders["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig())
    model.save_pretrained(tmp_path / "q")
    change, error, words = EDITS[edit]
    weights, config_path = tmp_path / "q" / "model.safetensors", tmp_path / "q" / "config.json"
    state, config = safetensors_torch.load_file(weights), json.loads(config_path.read_text())
    change(state, config)
    safetensors_torch.save_file(state, weights, metadata={"format": "pt"})
    config_path.write_text(json.dumps(config))
    with pytest.raises(error) as info:
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert words in str(info.value)


def test_file_tensors_are_the_modules_weights(folders):
    """The checkpoint's plain tensors give each module's dequantized weight (fp64: scale * q [+ offset])."""
    from qbackend.llm.checkpoint import checkpoint_state
    folder, _ = folders["llama"]
    for settings in (dict(), dict(weights="int4", lm_head="int4")):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig(**settings))
        state = checkpoint_state(model)
        own = qbackend.quantize_llm(transformers.AutoModelForCausalLM.from_pretrained(folder),
                                    qbackend.LLMConfig(fuse_projections=False, native_layers=False, **settings))
        for name in model.qbackend_llm["quantized"]:
            ref = own.get_submodule(name)
            if settings:
                q = state[name + ".weight_int4"]
                u = torch.stack([q & 15, q >> 4], dim=2).reshape(q.shape[0], -1)[:, :ref.in_features].double()
                scale = state[name + ".weight_scale"].double().repeat_interleave(32, dim=1)[:, :ref.in_features]
                offset = state[name + ".weight_offset"].double().repeat_interleave(32, dim=1)[:, :ref.in_features]
                w = scale * u + offset
            else:
                w = state[name + ".weight_scale"].double()[:, None] * state[name + ".weight_int8"].double()
            assert torch.allclose(w, ref.dequantized_weight().double() if settings else
                                  ref.weight_int8.double() * ref.w_scales.double(), rtol=0, atol=1e-6), name


@pytest.mark.parametrize("scheme", ["int8", "w4a8_g64_sym_int4_head", "int8_embedding"])
def test_a_model_quantize_llm_quantized_saves_and_reloads(folders, tmp_path, scheme):
    """quantize_llm on a model already loaded (as from a GGUF file, which from_pretrained does not combine
    with a quantization_config): save_pretrained writes the quantized form, from_pretrained reads it."""
    folder, _ = folders["llama_tied"]
    settings = SCHEMES[scheme]
    model = qbackend.quantize_llm(transformers.AutoModelForCausalLM.from_pretrained(folder),
                                  qbackend.LLMConfig(**settings))
    assert model.config.quantization_config.llm_config() == qbackend.LLMConfig(**settings)
    model.save_pretrained(tmp_path / "q")
    assert _saved_files(tmp_path / "q") == {"model.safetensors", "config.json", "generation_config.json"}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert torch.equal(_out(loaded), _out(model))
    assert loaded.qbackend_llm == model.qbackend_llm


def test_example_script_runs():
    proc = run_example("hf_from_pretrained.py", timeout=600)
    assert proc.stdout.count("reloaded output equal to the saved model's: True") == 2, proc.stdout
    assert "BERT encoder: BertModel with 2 static int8 blocks" in proc.stdout
    assert "generate: [" in proc.stdout


def test_a_bfloat16_model_round_trips_with_float32_scales(folders, tmp_path):
    folder, _ = folders["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig(),
                                                              dtype=torch.bfloat16)
    out = _out(model)
    assert out.dtype == torch.bfloat16 and model.lm_head.w_scales.dtype == torch.float32
    model.save_pretrained(tmp_path / "q")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    assert loaded.lm_head.w_scales.dtype == torch.float32 and torch.equal(_out(loaded), out)


def test_dequantize_says_why_not(folders):
    folder, _ = folders["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=QBackendConfig())
    with pytest.raises(NotImplementedError, match="load the FP32 checkpoint"):
        model.dequantize()
