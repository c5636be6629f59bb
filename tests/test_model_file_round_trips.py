"""Every kind of model qbackend produces survives qbackend.save / qbackend.load bit for bit: the zoo
models at small sizes (graph-captured CNNs and encoders, the module-swapped LSTM, the DLRM's
embedding tables), the dynamic and weight-only modes, and the accuracy-budgeted fallback model."""
from __future__ import annotations

import warnings

import pytest
import torch

import qbackend
from qbackend.models import MODELS

from .lowering.toy_models import Outlier

TINY_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=1000)
CASES = {
    "resnet18": dict(batch_size=2, image_size=32, num_calibration_batches=1, num_eval_batches=1, residual_gamma=0.3),
    "mobilenet_v2": dict(batch_size=2, image_size=32, num_calibration_batches=1, num_eval_batches=1,
                         residual_gamma=0.3),
    "bert_base": dict(batch_size=2, seq_len=16, num_calibration_batches=1, num_eval_batches=1, **TINY_BERT),
    "transformer_outliers": dict(batch_size=2, seq_len=16, num_calibration_batches=1, num_eval_batches=1),
    "lstm_classifier": dict(batch_size=4, seq_len=12, num_calibration_batches=1, num_eval_batches=1),
    "digits_cnn": dict(),
    "dlrm": dict(batch_size=16, rows=2000, num_calibration_batches=1, num_eval_batches=1),
}
MODES = [(name, None) for name in CASES] + [("bert_base", "dynamic"), ("resnet18", "weight_only")]


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if hasattr(out, "to_tuple"):
        return _flat(out.to_tuple())
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return []


@pytest.mark.parametrize("name,mode", MODES)
def test_zoo_round_trip(name, mode, tmp_path):
    case = MODELS[name](**CASES[name])
    mode = mode or case.mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "dynamic":
            q = qbackend.quantize_dynamic(case.model)
        else:
            q = qbackend.quantize(case.model, case.example_inputs, case.calibration,
                                  config=qbackend.QuantConfig(mode=mode))
        qbackend.save(q, tmp_path / "m.qb")
        needs = qbackend.serialization.inspect_file(tmp_path / "m.qb")["classes"]
        trusted = [__import__(c.split(":")[0].split(".")[0]) for c in needs]
        loaded = qbackend.load(tmp_path / "m.qb", classes=trusted)
    with torch.no_grad():
        for batch in case.evaluation:
            a, b = _flat(q(*batch)), _flat(loaded(*batch))
            assert len(a) == len(b) > 0
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
    sd, sd2 = q.state_dict(), loaded.state_dict()
    assert list(sd) == list(sd2) and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert [dict(r) for r in qbackend.explain(loaded)] == [dict(r) for r in qbackend.explain(q)]
    assert loaded.qbackend_activations == q.qbackend_activations


def test_fallback_model_round_trip(tmp_path):
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
    model = Outlier().eval()
    with torch.no_grad():
        truth = model(x).argmax(1)
    agree = lambda m: 100.0 * float((m(x).argmax(1) == truth).float().mean())  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = qbackend.quantize(model, (x[:64],), [x[i:i + 64] for i in range(0, 256, 64)], eval_fn=agree, max_drop=1.0)
        kept = q.qbackend_fallback.kept_fp32
        assert kept[0] == "fc2"  # the layer that quantizes worst goes first (more may follow, by the budget)
        qbackend.save(q, tmp_path / "f.qb")
        loaded = qbackend.load(tmp_path / "f.qb")
    with torch.no_grad():
        assert torch.equal(loaded(x), q(x))
    assert loaded.qbackend_fallback.kept_fp32 == kept and not any(k in loaded.qbackend_layers for k in kept)


_FRESH_LOAD = """
import sys, torch, transformers, qbackend
assert "transformers.modeling_outputs" not in sys.modules
try:
    qbackend.load(PATH)
except qbackend.serialization.ModelFileError as exc:
    print("REFUSED:", exc)
if MODE == "static":  # the output type's module imported by the caller: no trust needed
    import transformers.modeling_outputs
    q = qbackend.load(PATH)
else:
    q = qbackend.load(PATH, classes=[transformers])
ids, mask = torch.load(INPUTS)
torch.save(q(ids, mask).last_hidden_state, OUT)
q = qbackend.load(PATH, classes=[transformers])
torch.save(q(ids, mask).last_hidden_state, OUT + ".trusted")
"""


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_hugging_face_model_loads_in_a_fresh_process(mode, tmp_path):
    """A model whose output is a Hugging Face ModelOutput loads in a process that imported only
    `transformers` (not its modeling_outputs module, which registers the output type with pytree):
    refused with a message saying what to import or trust; loaded when the caller trusts the
    package (classes=[transformers], which imports its modules). The graph-captured model (static)
    names the ModelOutput only as its output's container, which needs no trust once imported; the
    module-swapped one (dynamic) is made of transformers' classes, which do."""
    from .subprocess_utils import run_py

    case = MODELS["bert_base"](**CASES["bert_base"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = qbackend.quantize_dynamic(case.model) if mode == "dynamic" else \
            qbackend.quantize(case.model, case.example_inputs, case.calibration)
    path, inputs, out = tmp_path / "m.qb", tmp_path / "x.pt", tmp_path / "y.pt"
    qbackend.save(q, path)
    batch = case.evaluation[0]
    torch.save(tuple(batch), inputs)
    code = (_FRESH_LOAD.replace("PATH", repr(str(path))).replace("INPUTS", repr(str(inputs)))
            .replace("OUT", repr(str(out))).replace("MODE", repr(mode)))
    proc = run_py(code, timeout=300, check=True)
    refusal = proc.stdout.split("REFUSED:")[1]
    assert "classes=[transformers]" in refusal
    if mode == "static":
        assert "import transformers.modeling_outputs" in refusal
    with torch.no_grad():
        expect = q(*batch).last_hidden_state
    assert torch.equal(torch.load(out), expect) and torch.equal(torch.load(str(out) + ".trusted"), expect)
