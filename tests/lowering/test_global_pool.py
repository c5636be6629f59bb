"""CNN classifier heads in int8: a global average pool (adaptive_avg_pool2d to 1 x 1) between the
last int8 layer and the classifier becomes one GlobalAvgPoolQuantize (qbackend::global_avg_pool2d)
on the layer's int8 output, with no float pool, dequantize or quantize left. Checked against the
fp64 reference on the integers the pool reads, on the graph (MobileNetV2-style and ResNet-style
heads, and the cases that stay in float), through save / load, torch.compile and torch.export,
and for a model requantized to 7-bit activations."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import GlobalAvgPoolQuantize, QuantizedConv2d, QuantizedLinear
from qbackend.nn.quant import Dequantize, Quantize
from qbackend.ops import reference as R
from qbackend.serialization.rebind import requantize_activations

pytestmark = [pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning"),
              pytest.mark.usefixtures("one_thread")]
aten = torch.ops.aten


class Head(nn.Module):
    """conv -> relu6 (MobileNetV2) or conv + residual -> relu (ResNet) -> global pool -> flatten -> fc."""

    def __init__(self, residual: bool = False, float_reader: bool = False):
        super().__init__()
        self.residual, self.float_reader = residual, float_reader
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.conv = nn.Conv2d(16, 16, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        y = torch.relu(self.conv(s) + s) if self.residual else nn.functional.relu6(self.conv(s))
        out = self.fc(torch.flatten(self.pool(y), 1))
        return (out, y.sum()) if self.float_reader else out


def _images(n, seed):
    return torch.randn(n, 3, 7, 7, generator=torch.Generator().manual_seed(seed))


def _quantize(**kw):
    torch.manual_seed(0)
    model = Head(**kw).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = qbackend.quantize(model, (_images(1, 0),), [(_images(8, 10 + i),) for i in range(3)])
    return model, q


def _pools(q):
    return [m for m in q.modules() if isinstance(m, GlobalAvgPoolQuantize)]


@pytest.fixture(scope="module", params=[False, True], ids=["relu6", "residual"])
def head(request):
    return _quantize(residual=request.param)


def test_head_is_one_int8_pool(head):
    _, q = head
    gm = q.graph_module
    nodes = list(gm.graph.nodes)
    assert len(_pools(q)) == 1
    assert not any(n.target is aten.adaptive_avg_pool2d.default for n in nodes)
    assert not any(n.op == "call_module" and isinstance(gm.get_submodule(n.target), (Dequantize, Quantize))
                   and n.target != "qbackend_quantize_0" for n in nodes)
    conv = q.layer("conv")
    assert isinstance(conv, QuantizedConv2d) and conv.out_dtype == torch.uint8
    pool = _pools(q)[0]
    assert (pool.x_scale, pool.x_zero_point, pool.x_value) == (conv.out_scale, conv.out_zero_point, conv.out_value)
    fc = q.layer("fc")
    assert isinstance(fc, QuantizedLinear)
    assert (fc.x_scale, fc.x_zero_point, fc.x_value) == (pool.scale, pool.zero_point, pool.value)


def test_pool_output_is_the_fp64_reference_on_its_integers(head):
    """The pool's output, given the int8 conv output it reads, is the fp64 mean quantized (7x7 maps:
    no rounding ties), and the model stays close to FP32."""
    model, q = head
    pool = _pools(q)[0]
    seen = []
    hook = pool.register_forward_hook(lambda m, args, out: seen.append((args[0].clone(), out.clone())))
    x = _images(5, 99)
    with torch.no_grad():
        y = q(x)
    hook.remove()
    (xq, out), = seen
    assert xq.dtype == torch.uint8 and xq.shape == (5, 16, 7, 7)
    ref = R.global_avg_pool2d(xq, pool.x_scale, pool.x_zero_point, pool.scale, pool.zero_point, torch.uint8)
    assert torch.equal(out, ref)
    with torch.no_grad():
        f = model(x)
    sqnr = 10 * torch.log10(f.pow(2).sum() / (f - y).pow(2).sum())
    assert float(sqnr) > 25


def test_plan_replays_save_load_compile_export_agree(head, tmp_path):
    _, q = head
    x = _images(3, 5)
    with torch.no_grad():
        ref = q(x)
        assert torch.equal(q(x), ref) and torch.equal(q(x), ref)  # recorded, then replayed
        qbackend.save(q, tmp_path / "m.qb")
        loaded = qbackend.load(tmp_path / "m.qb")
        assert len(_pools(loaded)) == 1 and torch.equal(loaded(x), ref)
        assert torch.equal(torch.compile(q, backend="aot_eager")(x), ref)
        assert torch.equal(torch.export.export(q, (x,)).module()(x), ref)


def test_pools_that_stay_float():
    """A pool whose input another float op also reads stays in float (the layer's output would
    otherwise be rounded for that reader too)."""
    _, q = _quantize(float_reader=True)
    assert not _pools(q)
    assert any(n.target is aten.adaptive_avg_pool2d.default for n in q.graph_module.graph.nodes)


def test_seven_bit_requantization_updates_both_sides_of_the_pool():
    _, q = _quantize()
    changed = requantize_activations(q, True)
    conv, pool, fc = q.layer("conv"), _pools(q)[0], q.layer("fc")
    assert pool.x_value in changed and pool.value in changed
    assert (pool.x_scale, pool.x_zero_point) == (conv.out_scale, conv.out_zero_point)
    assert (pool.scale, pool.zero_point) == (fc.x_scale, fc.x_zero_point)
    assert pool.qmax == 127
    with torch.no_grad():
        assert int(q(_images(4, 3)).isnan().sum()) == 0
