"""QuantConfig / ObserverSpec: validation when made, and override resolution (name > type > default)."""
import pytest
import torch

from qbackend.config import OBSERVERS, ObserverSpec, QuantConfig
from qbackend.observers import BestRangeObserver, PerChannelMinMaxObserver


def test_defaults_build_the_documented_observers():
    cfg = QuantConfig()
    assert cfg.mode == "static"
    act, w = cfg.activation.create("layer"), cfg.weight.create("layer.weight")
    assert isinstance(act, BestRangeObserver) and act.dtype == torch.uint8 and act.name == "layer"
    assert isinstance(w, PerChannelMinMaxObserver) and w.dtype == torch.int8 and w.symmetric


def test_every_named_observer_builds():
    for kind in OBSERVERS:
        kwargs = {"dtype": torch.int8, "symmetric": True} if kind == "per_channel_minmax" else {}
        assert isinstance(ObserverSpec(kind, kwargs).create(), OBSERVERS[kind])


@pytest.mark.parametrize("make,exc,text", [
    (lambda: ObserverSpec("kmeans"), ValueError, "unknown observer"),
    (lambda: ObserverSpec("histogram", {"bins": "many"}), TypeError, "bins"),
    (lambda: QuantConfig(mode="int4"), ValueError, "mode must be"),
    (lambda: QuantConfig(activation="histogram"), TypeError, "activation must be an ObserverSpec"),
    (lambda: QuantConfig(weight=ObserverSpec("minmax", {"dtype": torch.uint8})), ValueError, "int8 and symmetric"),
    (lambda: QuantConfig(by_type={int: None}), TypeError, "nn.Module subclasses"),
    (lambda: QuantConfig(by_name={"": None}), TypeError, "non-empty"),
    (lambda: QuantConfig(by_name={"fc": "fp32"}), TypeError, "QuantConfig or None"),
    (lambda: QuantConfig(bf16="auto"), TypeError, "bf16 must be True or False"),
])
def test_bad_configs_fail_when_made(make, exc, text):
    with pytest.raises(exc, match=text):
        make()


def test_override_resolution():
    dynamic = QuantConfig(mode="dynamic")
    cfg = QuantConfig(by_type={torch.nn.Linear: dynamic, torch.nn.Conv2d: None},
                      by_name={"encoder": None, "encoder.layer.1": QuantConfig(), "head": dynamic})
    lin, conv, relu = torch.nn.Linear(2, 2), torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU()

    class MyLinear(torch.nn.Linear):
        pass

    assert cfg.for_module("fc", lin) is dynamic              # by type
    assert cfg.for_module("fc", MyLinear(2, 2)) is dynamic   # by type, through the MRO
    assert cfg.for_module("stem", conv) is None              # type override: keep FP32
    assert cfg.for_module("act", relu) is cfg                # no override
    assert cfg.for_module("encoder.layer.0.fc", lin) is None  # dotted name prefix wins over type
    assert cfg.for_module("encoder.layer.1.fc", lin) == QuantConfig()  # the longest prefix wins
    assert cfg.for_module("encoderx", lin) is dynamic        # not a dotted prefix: falls to type
    assert cfg.for_module("head", conv) is dynamic           # exact name wins over type


def test_configs_are_frozen():
    cfg = QuantConfig(by_name={"fc": None})
    with pytest.raises(Exception):
        cfg.mode = "dynamic"
    with pytest.raises(TypeError):
        cfg.by_name["x"] = None


def test_bias_correction_setting():
    assert QuantConfig().bias_correction == "auto"
    for ok in ("auto", True, False):
        QuantConfig(bias_correction=ok)
    with pytest.raises(ValueError, match="bias_correction must be 'auto', True or False"):
        QuantConfig(bias_correction="yes")


def test_smoothquant_sample_outputs_checked():
    from qbackend.config import SmoothQuantConfig

    assert SmoothQuantConfig().sample_outputs == 256
    with pytest.raises(ValueError, match="sample_outputs must be an int >= 16"):
        SmoothQuantConfig(sample_outputs=8)
