"""prepare -> calibrate -> convert on small models: the structure of the int8 graph (fusion, int8
between layers, transparent ops in int8), each layer against the fp64 reference on the integers
it received, and the whole model against FP32."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import DynamicQuantizedLinear, GlobalAvgPoolQuantize, QuantizedConv2d, QuantizedLinear
from qbackend.nn.quant import Dequantize, Quantize

from .layer_reference import check_layers
from .toy_models import MLP, InvertedResidual, ResidualCNN, init_bn, sqnr

OPS = torch.ops.qbackend
pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")


def _images(n, seed, size=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


def _quantize(model, make, n_calib=4):
    prepared = qbackend.prepare(model, (make(0),))
    for i in range(n_calib):
        prepared(make(100 + i))
    return qbackend.convert(prepared)


def _count(q, kind):
    """How many Quantize / Dequantize borders the converted graph has."""
    return sum(1 for m in q.modules() if type(m) is kind)


@pytest.fixture(scope="module")
def residual_cnn():
    torch.manual_seed(0)
    model = init_bn(ResidualCNN())
    return model, _quantize(model, lambda s: _images(4, s))


def test_residual_cnn_fuses_and_stays_int8(residual_cnn):
    model, q = residual_cnn
    layers = q.qbackend_layers
    assert set(layers) == {"conv1", "b1c1", "b1c2", "b2c1", "b2c2", "down.0", "fc"}
    assert layers["conv1"].post_op == "relu" and layers["conv1"].output == "int8"
    assert layers["b1c2"].residual and layers["b1c2"].post_op == "relu"
    assert layers["b2c2"].residual and layers["b2c2"].output == "int8"  # the int8 global pool reads it
    assert layers["down.0"].output == "int8"  # read as b2c2's residual
    # BatchNorm folded away, the layers sit at their module paths
    assert isinstance(q.layer("b1c2"), QuantizedConv2d) and isinstance(q.layer("fc"), QuantizedLinear)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in q.modules())
    # int8 from the stem to fc: one quantize for the input, the pool requantizes for fc; no dequantize
    assert _count(q, Quantize) == 1 and _count(q, GlobalAvgPoolQuantize) == 1
    assert _count(q, Dequantize) == 0
    pool = [n for n in q.graph_module.graph.nodes if n.target is OPS.max_pool2d.default]
    assert len(pool) == 1
    x = _images(3, 7)
    assert q(x).dtype == torch.float32
    # the max pool ran on uint8
    seen = []
    h = q.layer("b1c1").register_forward_hook(lambda m, a, o: seen.append(a[0].dtype))
    q(x)
    h.remove()
    assert seen == [torch.uint8]


def test_residual_cnn_layers_match_reference(residual_cnn):
    _, q = residual_cnn
    assert check_layers(q, _images(2, 9)) == 7


def test_residual_cnn_accuracy_and_batch_sizes(residual_cnn):
    model, q = residual_cnn
    for n in (1, 2, 5):
        x = _images(n, 50 + n)
        with torch.no_grad():
            assert sqnr(model(x), q(x)) > 25


def test_inverted_residual_relu6_depthwise_add():
    torch.manual_seed(1)
    model = init_bn(InvertedResidual())
    q = _quantize(model, lambda s: _images(4, s))
    layers = q.qbackend_layers
    assert layers["stem.0"].post_op == "relu6"
    assert layers["block.0"].post_op == "relu6" and layers["block.3"].post_op == "relu6"
    assert layers["block.6"].residual and layers["block.6"].post_op == "none"
    x = _images(3, 11)
    check_layers(q, x)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25
    # relu6's bound holds on the int8 outputs of the fused layers
    outs = []
    m = q.layer("block.0")
    h = m.register_forward_hook(lambda mod, a, o: outs.append(o))
    q(x)
    h.remove()
    deq = (outs[0].double() - m.out_zero_point) * m.out_scale
    assert float(deq.max()) <= 6.0 + m.out_scale / 2


def test_mlp_chains_int8_and_handles_a_module_called_twice():
    torch.manual_seed(2)
    model = MLP().eval()
    make = lambda s: torch.randn(8, 32, generator=torch.Generator().manual_seed(s))  # noqa: E731
    q = _quantize(model, make)
    layers = q.qbackend_layers
    assert set(layers) == {"fc1", "fc2", "fc3", "shared", "shared@1"}
    assert layers["fc1"].post_op == "relu" and layers["fc1"].output == "int8"
    assert layers["fc2"].post_op == "gelu" and layers["fc2"].output == "int8"
    x = make(77)
    check_layers(q, x)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25


def test_config_keeps_layers_in_fp32_and_mixes_modes():
    torch.manual_seed(3)
    model = MLP().eval()
    make = lambda s: torch.randn(8, 32, generator=torch.Generator().manual_seed(s))  # noqa: E731
    cfg = qbackend.QuantConfig(by_name={"fc2": None, "fc3": qbackend.QuantConfig(mode="dynamic")},
                               by_type={})
    prepared = qbackend.prepare(model, (make(0),), config=cfg)
    prepared(make(1))
    q = qbackend.convert(prepared)
    assert "fc2" not in q.qbackend_layers
    assert isinstance(q.layer("fc3"), DynamicQuantizedLinear)
    assert q.qbackend_layers["fc1"].output == "float32"  # fc2 (FP32) reads it
    x = make(5)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25


def test_cat_runs_in_int8_with_shared_qparams():
    from .toy_models import CatCNN

    torch.manual_seed(4)
    model = CatCNN().eval()
    q = _quantize(model, lambda s: _images(4, s))
    layers = q.qbackend_layers
    assert layers["left"].output == "int8" and layers["right"].output == "int8"
    left, right, merge = (q.layer(n) for n in ("left", "right", "merge"))
    # both branches write the cat's qparams, which the merge conv reads: no requantize anywhere
    assert (left.out_scale, left.out_zero_point) == (right.out_scale, right.out_zero_point) \
        == (merge.x_scale, merge.x_zero_point)
    cats = [n for n in q.graph_module.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert len(cats) == 1
    assert _count(q, Quantize) == 2  # the input, and the head's input
    assert _count(q, Dequantize) == 0
    x = _images(3, 12)
    check_layers(q, x)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25


class _Masked(nn.Module):
    """A linear over tokens with a keyword mask: both inputs batch-1 in the example."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x, mask=None):
        y = torch.relu(self.fc(x))
        return y if mask is None else y * mask.unsqueeze(-1)


def test_batch1_example_routes_for_batch1_and_runs_any_batch():
    """torch.export hints a size-1 batch as 2 and qbackend captures a batch of one as two; the
    layers must still be routed, prepacked and recorded for the batch the user gave."""
    torch.manual_seed(0)
    model = init_bn(ResidualCNN())
    q = _quantize(model, lambda s: _images(1, s))
    for info in q.qbackend_layers.values():
        assert info.x_shape[0] == 1
        assert info.shape["n" if info.kind == "conv2d" else "m"] == 1
    for n in (1, 3):
        x = _images(n, 7)
        with torch.no_grad():
            assert sqnr(model(x), q(x)) > 25

    masked = _Masked().eval()
    x, mask = torch.randn(1, 5, 8), torch.ones(1, 5)
    p = qbackend.prepare(masked, (x,), example_kwargs={"mask": mask})
    for i in range(4):
        g = torch.Generator().manual_seed(i)
        p(torch.randn(4, 6, 8, generator=g), mask=torch.ones(4, 6))
    qm = qbackend.convert(p)
    assert qm.qbackend_layers["fc"].shape["m"] == 5  # 1 x 5 tokens, not 2 x 5
    x3, m3 = torch.randn(3, 4, 8), torch.ones(3, 4)
    with torch.no_grad():
        assert sqnr(masked(x3, mask=m3), qm(x3, mask=m3)) > 25


class _ResidualReadAgain(nn.Module):
    """A residual add whose input is read again after the conv (it must not be overwritten)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        y = torch.relu(self.conv(s) + s)
        return self.head(y) + self.head(s)


def test_residual_inputs_are_donated_only_when_dead(residual_cnn):
    """A residual conv writes into its int8 residual input (no copy) when nothing reads it later;
    the outputs are those of the copying path."""
    model, q = residual_cnn
    res = {name: q.layer(name) for name in ("b1c2", "b2c2")}
    assert all(m.has_accum for m in res.values())
    # b1c2's residual is the max-pooled stem, b2c2's the downsample conv's output: both dead after
    assert all(m.accum_donated for m in res.values())
    x = _images(3, 9)
    with torch.no_grad():
        donated = q(x)
        for m in res.values():
            m.accum_donated = False
        copied = q(x)
        for m in res.values():
            m.accum_donated = True
    assert torch.equal(donated, copied)

    torch.manual_seed(0)
    again = _ResidualReadAgain().eval()
    qa = _quantize(again, lambda s: _images(2, s))
    assert qa.layer("conv").has_accum and not qa.layer("conv").accum_donated
    with torch.no_grad():
        assert sqnr(again(x), qa(x)) > 25


class _ResidualOfOwnInput(nn.Module):
    """head(conv(s) + s): the residual is the conv's own input (it must not be written into)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        return self.head(torch.relu(self.conv(s) + s))


def test_residual_that_is_the_convs_own_input_is_not_donated():
    torch.manual_seed(0)
    model = _ResidualOfOwnInput().eval()
    q = _quantize(model, lambda s: _images(2, s))
    assert q.layer("conv").has_accum and not q.layer("conv").accum_donated
    x = _images(3, 9)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) > 25


class _ConvFlattenHead(nn.Module):
    """A conv whose float output is flattened (captured as aten.view) beside a float branch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.side = nn.EmbeddingBag(64, 4, mode="sum")
        self.head = nn.Linear(8 * 6 * 6 + 4, 5)

    def forward(self, x, ids, offsets):
        y = torch.relu(self.conv(x))
        return self.head(torch.cat([y.flatten(1), self.side(ids, offsets)], dim=1))


def test_views_of_channels_last_outputs_run():
    """The int8 conv writes channels-last; the FP32 graph's view of its (contiguous) output must
    still run on it, at the example's batch size and others."""
    torch.manual_seed(0)
    model = _ConvFlattenHead().eval()

    def batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, 3, 6, 6, generator=g), torch.randint(0, 64, (2 * n,), generator=g), torch.arange(0, 2 * n, 2)

    q = qbackend.quantize(model, batch(4, 0), [batch(4, s) for s in range(1, 9)])
    assert q.qbackend_layers["conv"].output == "float32"
    for n in (4, 5, 1):
        assert check_layers(q, *batch(n, 9)) == 2  # each int8 layer exact on the integers it received
        with torch.no_grad():
            assert sqnr(model(*batch(n, 9)), q(*batch(n, 9))) > 12  # the cat shares one range
    assert not any(node.target is torch.ops.aten.view.default for node in q.graph_module.graph.nodes)


_GROUPED_WITHOUT_VNNI = '''
import json, warnings, torch, qbackend
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.ReLU(),
                  nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).eval()
xs = [torch.randn(2, 3, 8, 8) for _ in range(4)]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    q = qbackend.quantize(m, (xs[0],), [(x,) for x in xs])
with torch.no_grad():
    x = torch.randn(3, 3, 8, 8)
    ref, y = m(x), q(x)
print(json.dumps({"sqnr": float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum())),
                  "qmax": {k: v.qmax for k, v in q.qbackend_activations.items()}}))
'''


def test_grouped_conv_without_vnni_takes_seven_bits_on_its_input_alone():
    """Without VNNI no provider multiplies a grouped conv's (several channels per group) 8-bit
    inputs exactly: its input is observed on 7 bits, every other value keeps 8."""
    import json

    from ..subprocess_utils import run_py

    proc = run_py(_GROUPED_WITHOUT_VNNI, env={"QBACKEND_ISA": "avx2"}, timeout=300, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["qmax"] == {"0.input": 255, "0.output": 127, "2.output": 255, "4.output": 255}
    assert out["sqnr"] > 25


def test_convert_leaves_the_prepared_model_to_calibrate_further():
    """convert shares the prepared graph's recorders (GPTQ's H, the observers) with the copy it
    rewrites and drops them from the copy only: the prepared model keeps them, so calibrating it
    further and converting again equals converting once after all the batches."""
    torch.manual_seed(3)
    model = MLP().eval()
    x = [torch.randn(16, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    twice = qbackend.prepare(model, (x[0],))
    once = qbackend.prepare(model, (x[0],))
    for b in x[:2]:
        twice(b)
    qbackend.convert(twice)
    for b in x[2:]:
        twice(b)
    for b in x:
        once(b)
    probe = torch.randn(8, 32, generator=torch.Generator().manual_seed(9))
    a, b = qbackend.convert(twice)(probe), qbackend.convert(once)(probe)
    assert torch.equal(a, b)
    recorded = {type(m).__name__ for m in twice._prepared.gm.modules()}
    assert {"HessianStats", "ActivationObserver"} <= recorded
