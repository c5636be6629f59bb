"""qbackend.compare: every quantized layer gets its SQNRs, two layers checked against an independent
computation (hooks on the FP32 model's own modules, no graph capture), the output statistics by
hand, the metric, JSON/markdown, the module-swap path, errors."""
from __future__ import annotations

import json
import math

import pytest
import torch

import qbackend
from qbackend.models import MODELS

pytestmark = [pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning"),
              pytest.mark.usefixtures("one_thread")]
TINY_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=1000)


def _sqnr(refs, outs):
    r = torch.cat([t.reshape(-1).double() for t in refs])
    o = torch.cat([t.reshape(-1).double() for t in outs])
    return 10 * math.log10(float(r.pow(2).sum()) / float((r - o).pow(2).sum()))


def _float(m, out):
    if getattr(m, "out_dtype", torch.float32) != torch.float32:
        return (out.double() - m.out_zero_point).float() * m.out_scale
    return out


def _independent(fp32_model, qmodel, batches, pairs):
    """{layer: SQNR} from hooks: the FP32 module whose output is the layer's place vs the INT8 layer."""
    refs = {k: [] for k in pairs}
    outs = {k: [] for k in pairs}
    hs = []
    for layer, fp32_module in pairs.items():
        hs.append(fp32_model.get_submodule(fp32_module).register_forward_hook(
            lambda m, i, o, k=layer: refs[k].append(o.detach())))
        hs.append(qmodel.layer(layer).register_forward_hook(lambda m, i, o, k=layer: outs[k].append(_float(m, o))))
    with torch.no_grad():
        for b in batches:
            fp32_model(*b)
            qmodel(*b)
    for h in hs:
        h.remove()
    return {k: _sqnr(refs[k], outs[k]) for k in pairs}


def test_resnet18():
    case = MODELS["resnet18"](batch_size=2, image_size=64, num_calibration_batches=2, num_eval_batches=2,
                              residual_gamma=0.3)
    q = qbackend.quantize(case.model, case.example_inputs, case.calibration)
    res = qbackend.compare(case.model, q, case.evaluation)
    assert [r.name for r in res.layers] == list(q.qbackend_layers) and len(res.layers) == 21
    assert all(r.sqnr_db is not None and r.local_sqnr_db is not None for r in res.layers)
    # conv2 of a block fuses the residual add and the ReLU: its place is the block's output
    ind = _independent(case.model, q, case.evaluation, {"layer1.0.conv2": "layer1.0", "fc": "fc"})
    by = {r.name: r for r in res.layers}
    for k, v in ind.items():
        assert by[k].sqnr_db == pytest.approx(v, abs=1e-3)  # BN-folded graph vs eager: fp32 rounding
    # the output statistics by hand
    with torch.no_grad():
        ref = torch.cat([case.model(*b) for b in case.evaluation]).double()
        out = torch.cat([q(*b) for b in case.evaluation]).double()
    assert res.output.sqnr_db == pytest.approx(_sqnr([ref], [out]), abs=1e-6)
    assert res.output.max_abs_error == pytest.approx(float((ref - out).abs().max()))
    assert res.output.cosine == pytest.approx(float(torch.nn.functional.cosine_similarity(
        ref.reshape(1, -1), out.reshape(1, -1))), abs=1e-9)
    ranked = res.ranked()
    assert [r.local_sqnr_db for r in ranked] == sorted(r.local_sqnr_db for r in ranked)
    d = json.loads(res.to_json())
    assert d["ranked"][0] == ranked[0].name and len(d["layers"]) == 21
    assert "| layer1.0.conv2 | conv2d |" in res.to_markdown()


def test_bert_and_metric():
    case = MODELS["bert_base"](batch_size=2, seq_len=16, num_calibration_batches=2, num_eval_batches=2, **TINY_BERT)
    q = qbackend.quantize(case.model, case.example_inputs, case.calibration)
    metric = lambda m: float(case.output(m(*case.evaluation[0])).abs().mean())  # noqa: E731
    res = qbackend.compare(case.model, q, case.evaluation, metric=metric)
    assert len(res.layers) == len(q.qbackend_layers) == 13
    assert all(r.sqnr_db is not None for r in res.layers)
    ind = _independent(case.model, q, case.evaluation,
                       {"encoder.layer.0.intermediate.dense": "encoder.layer.0.intermediate",  # dense + fused GELU
                        "encoder.layer.1.output.dense": "encoder.layer.1.output.dense"})
    by = {r.name: r for r in res.layers}
    for k, v in ind.items():
        assert by[k].sqnr_db == pytest.approx(v, abs=1e-3)  # BN-folded graph vs eager: fp32 rounding
    assert res.metric["fp32"] == pytest.approx(metric(case.model))
    assert res.metric["drop"] == pytest.approx(res.metric["fp32"] - res.metric["int8"])


def test_module_swap_and_dynamic():
    case = MODELS["lstm_classifier"](batch_size=3, seq_len=12, num_calibration_batches=1, num_eval_batches=2)
    q = qbackend.quantize_dynamic(case.model)
    res = qbackend.compare(case.model, q, case.evaluation)
    by = {r.name: r for r in res.layers}
    assert set(by) == set(q.qbackend_layers)
    assert all(r.sqnr_db is not None and r.sqnr_db > 20 for r in res.layers)


def test_errors():
    case = MODELS["digits_cnn"](batch_size=32, num_calibration_batches=1, num_eval_batches=1)
    q = qbackend.quantize(case.model, case.example_inputs, case.calibration)
    with pytest.raises(ValueError, match="at least one batch"):
        qbackend.compare(case.model, q, [])
    with pytest.raises(TypeError, match="qbackend.convert"):
        qbackend.compare(case.model, case.model, case.evaluation)
    with pytest.raises(TypeError, match="metric"):
        qbackend.compare(case.model, q, case.evaluation, metric=3)


@pytest.fixture(scope="module")
def mlp():
    from ..lowering.toy_models import MLP

    model = MLP().eval()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    return model, qbackend.quantize(model, (x,), [x]), x


def test_clean_batch_has_no_nonfinite_values(mlp):
    model, q, x = mlp
    res = qbackend.compare(model, q, [(x,)])
    o = res.output
    assert o.nonfinite_fp32 == 0 and o.nonfinite_int8 == 0
    assert math.isfinite(o.max_abs_error) and o.max_abs_error > 0 and o.sqnr_db > 20
    assert not any("non-finite" in n for n in res.notes)


def test_all_nan_batch_is_reported_not_zero(mlp):
    model, q, x = mlp
    nan = torch.full_like(x, math.nan)
    with torch.no_grad():
        expected = int((~torch.isfinite(model(nan))).sum())
    assert expected == nan.shape[0] * 32  # the FP32 output is all NaN
    res = qbackend.compare(model, q, [(nan,)])
    o = res.output
    assert o.nonfinite_fp32 == expected
    assert math.isnan(o.max_abs_error) and math.isnan(o.sqnr_db) and math.isnan(o.cosine)
    assert any(f"{expected} non-finite values in the FP32 output" in n for n in res.notes), res.notes
    md = res.to_markdown()
    assert "max abs error nan" in md and f"non-finite values: FP32 {expected}" in md
    d = json.loads(res.to_json())
    assert d["output"]["nonfinite_fp32"] == expected and d["output"]["max_abs_error"] is None


def test_one_inf_in_a_batch_is_reported(mlp):
    model, q, x = mlp
    bad = x.clone()
    bad[3, 5] = math.inf
    with torch.no_grad():
        expected_fp32 = int((~torch.isfinite(model(bad))).sum())
        expected_int8 = int((~torch.isfinite(q(bad))).sum())
    assert expected_fp32 > 0
    res = qbackend.compare(model, q, [(x,), (bad,)])  # one clean batch first: the error cannot stay at its value
    o = res.output
    assert (o.nonfinite_fp32, o.nonfinite_int8) == (expected_fp32, expected_int8)
    assert not math.isfinite(o.max_abs_error) and not math.isfinite(o.sqnr_db)
    assert any("non-finite" in n for n in res.notes)
