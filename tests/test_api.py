"""The public flow's errors and fallbacks: bad backend / model / inputs / config, uncalibrated
layers, empty and non-finite calibration, the module-swap fallback, quantize_dynamic."""
from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.api import CaptureFallbackWarning
from qbackend.nn import DynamicQuantizedLinear, WeightOnlyLinear
from qbackend.observers import NonFiniteWarning, ObserverError

from .lowering.toy_models import MLP, ResidualCNN, init_bn, sqnr

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")


def _x(n=4, seed=0):
    return torch.randn(n, 32, generator=torch.Generator().manual_seed(seed))


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'arm'.*x86"):
        qbackend.prepare(MLP().eval(), (_x(),), backend="arm")
    with pytest.raises(ValueError, match="unknown backend"):
        qbackend.quantize_dynamic(MLP().eval(), backend="cuda")


def test_model_not_on_cpu():
    model = MLP().eval()
    model.fc1.to("meta")
    with pytest.raises(ValueError, match=r"fc1\.weight on meta.*model\.cpu\(\)"):
        qbackend.prepare(model, (_x(),))


def test_training_mode_and_non_module():
    with pytest.raises(ValueError, match="training mode.*eval"):
        qbackend.prepare(MLP(), (_x(),))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        qbackend.prepare(lambda x: x, (_x(),))


def test_bad_example_inputs_and_config():
    with pytest.raises(TypeError, match="example_inputs must be a tuple"):
        qbackend.prepare(MLP().eval(), {"x": _x()})
    with pytest.raises(TypeError, match="QuantConfig"):
        qbackend.prepare(MLP().eval(), (_x(),), config={"mode": "static"})
    with pytest.raises(ValueError, match="mode='dynamic'"):
        qbackend.quantize_dynamic(MLP().eval(), config=qbackend.QuantConfig())
    with pytest.raises(ValueError, match="example input 0 is on meta"):
        qbackend.prepare(MLP().eval(), (_x().to("meta"),))


def test_by_name_override_must_name_a_module():
    cfg = qbackend.QuantConfig(by_name={"fc_1": None})
    with pytest.raises(ValueError, match=r"by_name\['fc_1'\] matches no module"):
        qbackend.prepare(MLP().eval(), (_x(),), config=cfg)
    with pytest.raises(ValueError, match="matches no module"):
        qbackend.quantize_dynamic(MLP().eval(), config=qbackend.QuantConfig(mode="dynamic", by_name={"x.fc1": None}))


def test_convert_uncalibrated_names_the_layer():
    prepared = qbackend.prepare(MLP().eval(), (_x(),))
    with pytest.raises(ObserverError, match=r"fc1\.input"):
        qbackend.convert(prepared)
    with pytest.raises(TypeError, match="qbackend.prepare returned"):
        qbackend.convert(MLP().eval())


def test_quantize_with_no_batches():
    with pytest.raises(ValueError, match="no batches"):
        qbackend.quantize(MLP().eval(), (_x(),), [])
    with pytest.raises(TypeError, match="calibration batches must be"):
        qbackend.quantize(MLP().eval(), (_x(),), [3.0])


def test_nonfinite_calibration_is_skipped_with_a_warning():
    torch.manual_seed(0)
    model = MLP().eval()
    bad = _x(4, 1)
    bad[0, :3] = float("nan")
    bad[1, 0] = float("inf")
    with pytest.warns(NonFiniteWarning, match=r"fc1\.input.*4"):
        q = qbackend.quantize(model, (_x(),), [bad, _x(4, 2)])
    x = _x(6, 3)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25


def test_nonfinite_raise_policy():
    cfg = qbackend.QuantConfig(activation=qbackend.ObserverSpec("minmax", {"nonfinite": "raise"}))
    bad = _x()
    bad[0, 0] = float("nan")
    with pytest.raises(ObserverError, match="fc1.input"):
        qbackend.quantize(MLP().eval(), (_x(),), [bad], config=cfg)


class _DataDependent(nn.Module):
    """Python control flow on tensor values: torch.export cannot capture it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 16), nn.Linear(16, 8)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = torch.relu(h)
        return self.b(h)


def test_capture_failure_falls_back_to_module_swap():
    torch.manual_seed(0)
    model = _DataDependent().eval()
    with pytest.warns(CaptureFallbackWarning, match="torch.export could not capture"):
        prepared = qbackend.prepare(model, (_x(),))
    assert prepared.method == "module_swap"
    for i in range(3):
        prepared(_x(8, 10 + i))
    q = qbackend.convert(prepared)
    assert set(q.qbackend_layers) == {"a", "b"}
    x = _x(5, 99)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25
    assert model.a.__class__ is nn.Linear  # the user's model is untouched


def test_quantize_dynamic_and_weight_only():
    torch.manual_seed(1)
    model = MLP().eval()
    q = qbackend.quantize_dynamic(model)
    assert all(isinstance(q.layer(n), DynamicQuantizedLinear) for n in ("fc1", "fc2", "fc3", "shared"))
    assert isinstance(model.fc1, nn.Linear)
    w = qbackend.quantize_dynamic(model, config=qbackend.QuantConfig(mode="weight_only"))
    assert isinstance(w.layer("fc1"), WeightOnlyLinear)
    x = _x(7, 4)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25
        assert sqnr(model(x), w(x)) > 30


def test_prepared_model_exposes_mergeable_observers():
    model = init_bn(ResidualCNN())
    img = lambda s: torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(s))  # noqa: E731
    a = qbackend.prepare(model, (img(0),))
    b = qbackend.prepare(model, (img(0),))
    one = qbackend.prepare(model, (img(0),))
    for s in range(4):
        (a if s % 2 else b)(img(s))
        one(img(s))
    for name, obs in a.observers().items():
        obs.merge(b.observers()[name])
        assert obs.compute_qparams() == one.observers()[name].compute_qparams(), name


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x, y, scale=None):
        out = self.a(x) + self.b(y)
        return (out, out * scale) if scale is not None else out


def test_positional_calls_skip_the_input_spec_and_match_it():
    """A call with exactly the graph's positional inputs passes them through without the pytree
    flatten (QuantizedModel._positional) and gives what the flattening path gives; inputs may be
    passed by their names, as to the FP32 model; a call of another structure gets a TypeError
    naming the captured inputs."""
    torch.manual_seed(0)
    model = _TwoInputs().eval()
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    qmodel = qbackend.quantize(model, (x, y), [(torch.randn(8, 16), torch.randn(8, 16))])
    assert qmodel._positional == 2
    fast = qmodel(x, y)
    assert fast.shape == (4, 8)
    assert torch.equal(qmodel(x, y=y), fast) and torch.equal(qmodel(y=y, x=x), fast)
    assert torch.equal(qmodel.inner(x, y)[0], fast)
    assert torch.equal(pickle.loads(pickle.dumps(qmodel))(x, y=y), fast)
    with pytest.raises(TypeError, match=r"positional inputs \(x, y\); got 1 positional"):
        qmodel(x)
    with pytest.raises(TypeError, match="keywords \\['scale'\\]"):
        qmodel(x, y, scale=torch.tensor(2.0))
    k = torch.tensor(2.0)
    qk = qbackend.quantize(model, (x, y), [{"x": x, "y": y, "scale": k}], example_kwargs={"scale": k})
    assert qk._positional == -1
    out, scaled = qk(x, y, scale=k)
    assert torch.allclose(scaled, out * 2)
    assert torch.equal(qk(x=x, y=y, scale=k)[0], out)
