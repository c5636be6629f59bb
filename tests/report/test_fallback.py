"""The accuracy-budgeted fallback on a model built to have one layer that quantizes badly: a huge
activation outlier in fc2's input (fc1's channel 0 scaled 1000x, fc2's weights scaled back so the
FP32 function is unchanged) crushes every other channel of that input to zero in INT8."""
from __future__ import annotations

import warnings

import pytest
import torch

import qbackend
from qbackend.report import BudgetWarning

from tests.lowering.toy_models import Outlier


X = torch.randn(512, 16, generator=torch.Generator().manual_seed(1))


def _labels(model):
    with torch.no_grad():
        return model(X).argmax(1)


def test_outlier_layer_found_first_and_budget_met():
    model = Outlier().eval()
    truth = _labels(model)
    agree = lambda m: 100.0 * float((_labels(m) == truth).float().mean())  # noqa: E731
    calib = [X[i:i + 64] for i in range(0, 256, 64)]
    # an example of 16 rows: outside the 7-bit table (M = 4 .. 7), so 8-bit activations on every CPU
    plain = qbackend.quantize(model, (X[:16],), calib)
    assert agree(plain) < 90  # the outlier really hurts
    ranked = qbackend.compare(model, plain, calib).ranked()
    assert ranked[0].name == "fc2"
    q = qbackend.quantize(model, (X[:16],), calib, eval_fn=agree, max_drop=1.0)
    rep = q.qbackend_fallback
    assert rep.met and rep.kept_fp32 == ["fc2"]
    assert agree(q) >= 99.0 and "fc2" not in q.qbackend_layers and {"fc1", "fc3"} <= set(q.qbackend_layers)
    assert rep.steps[0]["kept"] == 0 and rep.steps[0]["drop"] > 1.0
    assert set(rep.latency_ms) == {"fp32", "returned"}
    assert "kept in FP32 (1): fc2" in rep.to_markdown()


def test_budget_that_cannot_be_met_returns_the_best_model():
    model = Outlier().eval()
    calib = [X[i:i + 64] for i in range(0, 256, 64)]
    impossible = lambda m: -1.0 if isinstance(m, qbackend.QuantizedModel) else 0.0  # noqa: E731
    with pytest.warns(BudgetWarning, match="could not be met"):
        q = qbackend.quantize(model, (X[:64],), calib, eval_fn=impossible, max_drop=0.5)
    assert not q.qbackend_fallback.met and isinstance(q, qbackend.QuantizedModel)


def test_argument_errors():
    model = Outlier().eval()
    with pytest.raises(ValueError, match="both eval_fn and max_drop"):
        qbackend.quantize(model, (X[:8],), [X[:8]], eval_fn=lambda m: 0.0)
    with pytest.raises(ValueError, match="max_drop must be >= 0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qbackend.quantize(model, (X[:8],), [X[:8]], eval_fn=lambda m: 0.0, max_drop=-1)
