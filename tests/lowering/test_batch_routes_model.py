"""Routes by batch size through the whole flow: a model converted from batch-16 examples runs each
layer, at every batch size, on the provider the rule table gives for that size; the choice survives
save / load, shows in explain(), and is what torch.export traces at a given batch size.
QuantConfig(route_by_batch=False) keeps one provider per layer. The depthwise + 1x1 chain here is one
the fusion table would run as one block on a single provider (tests/lowering/test_inverted_residual.py),
so these models are converted with QuantConfig(fusions=False): each layer routed on its own."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import qbackend
from qbackend.dispatch import cpu_features, route
from qbackend.serialization.rebind import is_8bit_input
from qbackend.nn import QuantizedConv2d, QuantizedLinear

from .toy_models import init_bn, sqnr

EXAMPLE_BATCH = 16
SIZES = (1, 2, 3, 8, 12, 13, 16, 40)


class DepthwiseNet(nn.Module):
    """Stem 3x3 (3 -> 96), depthwise 3x3 stride 2 (96 channels at 56x56), 1x1 (96 -> 32), pool, Linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 96, 3, padding=1, bias=False), nn.BatchNorm2d(96), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(96, 96, 3, stride=2, padding=1, groups=96, bias=False), nn.BatchNorm2d(96),
                                nn.ReLU())
        self.pw = nn.Sequential(nn.Conv2d(96, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pw(self.dw(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _images(n, seed):
    return torch.randn(n, 3, 56, 56, generator=torch.Generator().manual_seed(seed))


def _convert(config=None):
    config = dataclasses.replace(config or qbackend.QuantConfig(), fusions=False)
    torch.manual_seed(0)
    model = init_bn(DepthwiseNet()).eval()
    prepared = qbackend.prepare(model, (_images(EXAMPLE_BATCH, 0),), config=config)
    for i in range(3):
        prepared(_images(EXAMPLE_BATCH, 100 + i))
    return model, qbackend.convert(prepared)


@pytest.fixture(scope="module")
def converted():
    return _convert()


def _layers(qmodel):
    for name, info in qmodel.qbackend_layers.items():
        m = qmodel.layer(name)
        if isinstance(m, (QuantizedConv2d, QuantizedLinear)):
            yield name, info, m


def test_every_size_runs_on_the_rule_tables_provider(converted):
    _, qmodel = converted
    split = []
    for name, info, m in _layers(qmodel):
        eight = is_8bit_input(m, qmodel.qbackend_activations)
        key = "n" if info.kind == "conv2d" else "m"
        chosen = {s: m.packed._form(s)[0].name for s in SIZES}
        expected = {s: route(info.kind, {**info.shape, key: s}, eight_bit_input=eight).provider for s in SIZES}
        assert chosen == expected, name
        assert m.provider == expected[EXAMPLE_BATCH], name
        routes = m.packed.batch_routes
        if routes is None:
            assert len(set(expected.values())) == 1, name
            continue
        # a split (possibly beyond SIZES): each range's provider is the rule table's at both its ends
        split.append(name)
        lo = 1
        for upper, provider in routes.ranges:
            hi = upper if upper is not None else 10 ** 4
            for s in (lo, hi):
                assert route(info.kind, {**info.shape, key: s}, eight_bit_input=eight).provider == provider, (name, s)
            lo = hi + 1
        assert m.packed.packed_providers == tuple(dict.fromkeys(routes.provider_for(s) for s in range(1, 10 ** 4))), name
        assert "by batch size: " + routes.describe() in info.why, name
    if cpu_features().isa_class == "avx512_vnni":
        # the depthwise conv (stride 2, 96 channels: not whole 64-channel blocks) is native up to 4M
        # input values (n <= 13 here), oneDNN beyond; the stem (3 input channels) is native at every size
        dw = qmodel.layer("dw.0")
        assert dw.packed.batch_routes.ranges == ((13, "native"), (None, "onednn"))
        stem = qmodel.layer("stem.0")
        assert stem.packed.batch_routes is None and stem.provider == "native"
        assert "dw.0" in split


def test_outputs_at_each_batch_size_match_fp32_and_the_one_provider_model(converted):
    model, qmodel = converted
    _, fixed = _convert(qbackend.QuantConfig(route_by_batch=False))
    assert all(m.packed.batch_routes is None for _, _, m in _layers(fixed))
    for n in (1, 5, EXAMPLE_BATCH, 20):
        x = _images(n, 7 + n)
        with torch.no_grad():
            ref, y, y_fixed = model(x), qmodel(x), fixed(x)
        assert y.shape == ref.shape == (n, 10)
        assert sqnr(ref, y) > 20, n
        # the same int8 model on other kernels: equal up to a few output LSBs of some layers
        assert sqnr(y_fixed, y) > 30, n


def test_save_load_keeps_routes(converted, tmp_path):
    _, qmodel = converted
    path = tmp_path / "m.qb"
    qbackend.save(qmodel, path)
    loaded = qbackend.load(path)
    for (name, _, m), (_, _, m2) in zip(_layers(qmodel), _layers(loaded)):
        assert m2.packed.batch_routes == m.packed.batch_routes, name
    for n in (1, EXAMPLE_BATCH):
        x = _images(n, 3)
        with torch.no_grad():
            assert torch.equal(loaded(x), qmodel(x)), n


@pytest.mark.skipif(cpu_features().isa_class != "avx512_vnni", reason="the native depthwise row of AVX512-VNNI")
def test_export_traces_the_provider_of_its_batch_size(converted):
    _, qmodel = converted

    def conv_ops(n):
        ep = torch.export.export(qmodel, (_images(n, 1),))
        return sorted(str(node.target) for node in ep.graph.nodes
                      if node.op == "call_function" and "conv2d" in str(node.target))

    at_1, at_16 = conv_ops(1), conv_ops(EXAMPLE_BATCH)
    assert at_1.count("qbackend.native_conv2d.default") == 3, at_1  # stem, depthwise, pointwise
    assert at_16.count("qbackend.onednn_conv2d.default") == 1, at_16  # the depthwise conv (the stem stays native)
