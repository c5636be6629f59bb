"""QBackendConfig(mode="static") through from_pretrained (qbackend.hf.static_blocks): a BERT encoder's
layers each become qbackend's static int8 graph, equal bit for bit to qbackend.quantize of each layer on
the inputs it sees in the float model, close to FP32, the same with and without an all-ones mask;
save_pretrained writes safetensors and JSON only and from_pretrained(saved_dir) gives the same model;
wrong settings, models the mode does not fit and edited folders get errors naming what is wrong."""
from __future__ import annotations

import json
import math
import os
import warnings

import pytest
import torch

import qbackend
from qbackend.serialization import ModelFileError

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402
from qbackend.hf import QBackendConfig  # noqa: E402
from qbackend.hf.static_blocks import StaticBlock  # noqa: E402
from qbackend.llm.checkpoint import CheckpointError  # noqa: E402


def _bert(cls=transformers.BertModel):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    return cls(cfg).eval()


def _batch(seed, n=3, length=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 320, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[1:, length - 4:] = 0  # padded rows
    return {"input_ids": ids, "attention_mask": mask}


CALIBRATION = [_batch(s) for s in range(3)]
HELD_OUT = _batch(10)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(float folder, float model, the static model from_pretrained made, its saved folder)."""
    root = tmp_path_factory.mktemp("static")
    fp32 = _bert()
    fp32.save_pretrained(root / "fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(
            root / "fp32", quantization_config=QBackendConfig(mode="static", calibration=CALIBRATION))
    model.save_pretrained(root / "q")
    return root / "fp32", fp32, model, root / "q"


def _hidden(model, batch=HELD_OUT):
    with torch.no_grad():
        return model(**batch).last_hidden_state


def test_blocks_become_static_graphs_equal_to_qbackends_own_api(saved):
    _, fp32, model, _ = saved
    assert type(model) is transformers.BertModel
    assert model.qbackend_blocks == ["encoder.layer.0", "encoder.layer.1"]
    assert all(isinstance(layer, StaticBlock) for layer in model.encoder.layer)
    # The same with qbackend's API: each float layer quantized on the inputs it sees in the float model.
    reference, inputs = _bert(), {i: [] for i in range(2)}
    hooks = [reference.encoder.layer[i].register_forward_pre_hook(
        lambda mod, args, i=i: inputs[i].append((args[0], args[1])), with_kwargs=False) for i in range(2)]
    with torch.no_grad():
        for batch in CALIBRATION:
            reference(**batch)
    for h in hooks:
        h.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = [qbackend.quantize(reference.encoder.layer[i], inputs[i][0], inputs[i]) for i in range(2)]
    captured = []
    hook = reference.encoder.layer[0].register_forward_pre_hook(lambda mod, args: captured.append(args))
    with torch.no_grad():
        reference(**HELD_OUT)
    hook.remove()
    x, mask = captured[0][0], captured[0][1]
    with torch.no_grad():
        for graph in graphs:
            x = graph(x, mask)
    assert torch.equal(_hidden(model), x)
    ref = _hidden(fp32)
    out = _hidden(model)
    sqnr = 10 * math.log10(float(ref.pow(2).sum() / (out - ref).pow(2).sum()))
    assert 25 < sqnr < 80, sqnr


def test_a_call_without_a_mask_equals_an_all_ones_mask(saved):
    _, _, model, _ = saved
    ids = HELD_OUT["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).last_hidden_state,
                           model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state)


def test_saved_folder_reloads_the_same_model(saved):
    _, _, model, folder = saved
    assert set(os.listdir(folder)) == {"model.safetensors", "config.json"}
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["mode"] == "static" and set(config["static_blocks"]) == {"encoder.layer.0", "encoder.layer.1"}
    assert "calibration" not in config
    with safe_open(folder / "model.safetensors", "pt") as f:
        meta = f.metadata()
        assert "qbackend_block:encoder.layer.0:qbackend" in meta and "encoder.layer.0.t0" in f.keys()
        assert "embeddings.word_embeddings.weight" in f.keys()
    loaded = transformers.AutoModel.from_pretrained(folder)
    assert isinstance(loaded.encoder.layer[1], StaticBlock)
    assert torch.equal(_hidden(loaded), _hidden(model))
    assert torch.equal(_hidden(loaded, CALIBRATION[0]), _hidden(model, CALIBRATION[0]))


def test_a_block_named_in_modules_to_not_convert_stays_float(saved, tmp_path):
    fp32_dir, fp32, _, _ = saved
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(fp32_dir, quantization_config=QBackendConfig(
            mode="static", calibration=CALIBRATION, modules_to_not_convert=["encoder.layer.1.output"]))
    assert isinstance(model.encoder.layer[0], StaticBlock)
    assert type(model.encoder.layer[1]) is transformers.models.bert.modeling_bert.BertLayer
    model.save_pretrained(tmp_path / "q")
    loaded = transformers.AutoModel.from_pretrained(tmp_path / "q")
    assert type(loaded.encoder.layer[1]) is type(model.encoder.layer[1])
    assert torch.equal(_hidden(loaded), _hidden(model))


@pytest.mark.parametrize("kwargs, words", [
    (dict(mode="static", weights="int4"), "weights apply to mode='dynamic'"),
    (dict(mode="static", activations="int8"), "activations apply to mode='dynamic'"),
    (dict(mode="fast"), "mode must be one of dynamic, static"),
    (dict(smoothquant=None), "apply to mode='static'"),
    (dict(mode="static", weight_rounding="adaround"), "weight_rounding must be one of"),
    (dict(mode="static", attention="flash"), "attention must be one of"),
    (dict(mode="static", smoothquant="always"), "smoothquant must be 'auto' or None"),
    (dict(mode="static", per_token_inputs="always"), "per_token_inputs must be 'auto', True or False"),
    (dict(per_token_inputs=False), "apply to mode='static'"),
])
def test_bad_static_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError) as info:
        QBackendConfig(**kwargs)
    assert words in str(info.value)


def test_static_without_calibration_is_refused(saved):
    fp32_dir = saved[0]
    with pytest.raises(ValueError, match="mode='static' needs calibration"):
        transformers.AutoModel.from_pretrained(fp32_dir, quantization_config=QBackendConfig(mode="static"))


def test_a_decoder_whose_blocks_take_more_inputs_is_refused(tmp_path):
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    llama.save_pretrained(tmp_path / "fp32")
    with pytest.raises(ValueError, match=r"static blocks take \(hidden_states, attention_mask\) only"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", quantization_config=QBackendConfig(
            mode="static", calibration=[torch.randint(0, 320, (1, 8))]))


def _rewrite(folder, change_tensors=None, change_meta=None, change_config=None):
    path = folder / "model.safetensors"
    with safe_open(path, "pt") as f:
        meta = dict(f.metadata())
    tensors = safetensors_torch.load_file(path)
    if change_tensors:
        change_tensors(tensors)
    if change_meta:
        change_meta(meta)
    safetensors_torch.save_file(tensors, path, metadata=meta)
    if change_config:
        config = json.loads((folder / "config.json").read_text())
        change_config(config["quantization_config"])
        (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("edit, error, words", [
    (dict(change_tensors=lambda t: t.__setitem__("encoder.layer.0.t0", t["encoder.layer.0.t0"] + 1)),
     ModelFileError, "does not match its checksum"),
    (dict(change_tensors=lambda t: t.pop("encoder.layer.1.t3")), ModelFileError, "does not match its checksum"),
    (dict(change_meta=lambda m: [m.pop(k) for k in list(m) if k.startswith("qbackend_block:encoder.layer.1:")]),
     ModelFileError, "no int8 graph for the static block encoder.layer.1"),
    (dict(change_meta=lambda m: m.__setitem__("qbackend_block:encoder.layer.0:qbackend", "{}")), ModelFileError,
     "does not match its checksum"),
    (dict(change_config=lambda c: c["static_blocks"]["encoder.layer.0"].update(mask={"dtype": "int3"})),
     ValueError, "a mask form must be null or"),
    (dict(change_config=lambda c: c["static_blocks"].update({"encoder.layer.9": {"mask": None}})),
     ValueError, "the checkpoint has a static block at 'encoder.layer.9', which the model does not have"),
])
def test_an_edited_static_folder_is_refused(saved, tmp_path, edit, error, words):
    import shutil

    shutil.copytree(saved[3], tmp_path / "q")
    _rewrite(tmp_path / "q", **edit)
    with pytest.raises(error) as info:
        transformers.AutoModel.from_pretrained(tmp_path / "q")
    assert words in str(info.value)


@pytest.mark.parametrize("which", ["quantized on load", "reloaded"])
def test_hidden_states_are_recorded_and_attentions_refused(saved, which):
    _, fp32, model, folder = saved
    if which == "reloaded":
        model = transformers.AutoModel.from_pretrained(folder)
    with torch.no_grad():
        out = model(**HELD_OUT, output_hidden_states=True)
        ref = fp32(**HELD_OUT, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3
    assert torch.equal(out.hidden_states[0], ref.hidden_states[0])  # the embeddings stay float
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.allclose(out.hidden_states[1], ref.hidden_states[1], atol=0.1)
    with pytest.raises(ValueError, match="runs \\(hidden_states, attention_mask\\) only, got output_attentions"):
        model(**HELD_OUT, output_attentions=True)


def test_a_folder_saved_here_loads_where_only_avx2_runs(saved, tmp_path):
    """Reloading routes for the loading CPU: a child process with the faster ISAs masked loads both
    modes' folders and gives outputs close to the saved models' (other kernels, the same integers
    where the products are exact)."""
    from tests.subprocess_utils import run_py

    _, _, static_model, static_dir = saved
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    llama.save_pretrained(tmp_path / "llama")
    dynamic = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "llama", quantization_config=QBackendConfig(weights="int4", activations="int8"))
    dynamic.save_pretrained(tmp_path / "llama_q")
    torch.save({"static": _hidden(static_model), "dynamic": dynamic(input_ids=HELD_OUT["input_ids"]).logits.detach(),
                "batch": HELD_OUT}, tmp_path / "expected.pt")
    code = f"""
import warnings, torch, qbackend, transformers
warnings.simplefilter("ignore")
assert qbackend.cpu_features().isa_class == "avx2", qbackend.cpu_features().isa_class
expected = torch.load({str(tmp_path / 'expected.pt')!r})
static = transformers.AutoModel.from_pretrained({str(static_dir)!r})
dynamic = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'llama_q')!r})
with torch.no_grad():
    s = static(**expected["batch"]).last_hidden_state
    d = dynamic(input_ids=expected["batch"]["input_ids"]).logits
def sqnr(ref, out):
    return float(10 * torch.log10(ref.pow(2).sum() / (out - ref).pow(2).sum().clamp_min(1e-30)))
print(sqnr(expected["static"], s), sqnr(expected["dynamic"], d))
"""
    out = run_py(code, env={"QBACKEND_ISA": "avx2"}, check=True).stdout.split()
    static_sqnr, dynamic_sqnr = float(out[-2]), float(out[-1])
    assert static_sqnr > 30 and dynamic_sqnr > 60, (static_sqnr, dynamic_sqnr)


@pytest.mark.parametrize("form", ["BatchEncoding list", "one BatchEncoding", "one input_ids tensor"])
def test_calibration_takes_a_tokenizers_output_or_one_batch(saved, form):
    fp32_dir = saved[0]
    batches = {"BatchEncoding list": [transformers.BatchEncoding(b) for b in CALIBRATION],
               "one BatchEncoding": transformers.BatchEncoding(CALIBRATION[0]),
               "one input_ids tensor": CALIBRATION[0]["input_ids"]}[form]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(fp32_dir, quantization_config=QBackendConfig(
            mode="static", calibration=batches))
    assert isinstance(model.encoder.layer[0], StaticBlock)
    if form == "BatchEncoding list":
        assert torch.equal(_hidden(model), _hidden(saved[2]))  # the same batches as dicts: the same model


def test_calibration_of_another_kind_is_refused(saved):
    with pytest.raises(TypeError, match="calibration must be batches"):
        transformers.AutoModel.from_pretrained(saved[0], quantization_config=QBackendConfig(
            mode="static", calibration=42))


def test_per_token_inputs_setting_reaches_the_blocks(saved, tmp_path):
    from qbackend.nn import TokenQuantizedLinear

    fp32_dir, _, model, _ = saved
    assert QBackendConfig(mode="static").quant_config().per_token_inputs == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        static = transformers.AutoModel.from_pretrained(fp32_dir, quantization_config=QBackendConfig(
            mode="static", calibration=CALIBRATION, per_token_inputs=False))
        forced = transformers.AutoModel.from_pretrained(fp32_dir, quantization_config=QBackendConfig(
            mode="static", calibration=CALIBRATION, per_token_inputs=True))
    count = lambda m: sum(isinstance(x, TokenQuantizedLinear) for x in m.modules())  # noqa: E731
    assert count(static) == 0 and count(forced) == 2  # one FFN down projection per block
    forced.save_pretrained(tmp_path / "q")
    loaded = transformers.AutoModel.from_pretrained(tmp_path / "q")
    assert count(loaded) == 2 and torch.equal(_hidden(loaded), _hidden(forced))
