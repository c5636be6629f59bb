"""The input-layout pass (lowering/input_layout.py): a Quantize read only by convs writes
channels-last int8, with the same values, and only there."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn.quant import Quantize

pytestmark = [pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning"),
              pytest.mark.usefixtures("one_thread")]


class TwoInputs(nn.Module):
    """An image into a stem conv (and a float op on the stem's input), a vector into a Linear."""

    def __init__(self, image_read_in_float: bool = False):
        super().__init__()
        self.image_read_in_float = image_read_in_float
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(6, 4)

    def forward(self, image, vector):
        y = torch.relu(self.stem(image)).mean((2, 3))
        if self.image_read_in_float:
            y = y + image.mean()
        return y.sum(1, keepdim=True) + self.fc(vector)


def _inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 13, 11, generator=g), torch.randn(n, 6, generator=g)


def _quantize(**kw):
    torch.manual_seed(0)
    model = TwoInputs(**kw).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qbackend.quantize(model, _inputs(1, 0), [_inputs(4, 10 + i) for i in range(3)])


def _quantizes(q) -> dict:
    """Quantize module -> the target of the node reading it (the first reader)."""
    gm = q.graph_module
    out = {}
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), Quantize):
            out[gm.get_submodule(node.target)] = sorted(str(u.target) for u in node.users)
    return out


def _reference_layout(q, x):
    """q's outputs with every Quantize writing its input's own layout."""
    marked = [m for m in q.modules() if isinstance(m, Quantize) and m.channels_last]
    for m in marked:
        m.channels_last = False
    q.forward_plans = False
    try:
        return q(*x)
    finally:
        for m in marked:
            m.channels_last = True
        q.forward_plans = True


def test_only_the_conv_input_is_channels_last():
    q = _quantize()
    quantizes = _quantizes(q)
    marked = [m for m in quantizes if m.channels_last]
    assert len(marked) == 1, quantizes
    (readers,) = [r for m, r in quantizes.items() if m.channels_last]
    assert all(isinstance(q.graph_module.get_submodule(t), qbackend.nn.QuantizedConv2d) for t in readers)
    assert "channels-last output" in repr(marked[0])
    x = _inputs(5, 99)
    q.forward_plans = False
    ours = q(*x)
    assert torch.equal(ours, _reference_layout(q, x))
    q.forward_plans = True
    for _ in range(3):  # recorded forward plans replay the same ops
        assert torch.equal(q(*x), ours)
    # the stem's int8 input really is channels-last, straight from the quantize
    seen = []
    handle = q.layer("stem").register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    q(*x)
    handle.remove()
    assert seen and seen[0].dtype == torch.uint8 and seen[0].is_contiguous(memory_format=torch.channels_last)


def test_a_quantize_with_a_float_reader_is_not_marked():
    """The image also read by a float op: its quantize (if any reads it in int8 besides the conv)
    keeps its layout wherever a reader is not a conv's input."""
    q = _quantize(image_read_in_float=True)
    for m, readers in _quantizes(q).items():
        if m.channels_last:
            assert all(isinstance(q.graph_module.get_submodule(t), qbackend.nn.QuantizedConv2d) for t in readers)
    x = _inputs(2, 5)
    assert torch.equal(q(*x), _reference_layout(q, x))


def test_saved_and_loaded(tmp_path):
    q = _quantize()
    path = tmp_path / "m.qb"
    qbackend.save(q, path)
    loaded = qbackend.load(path)
    assert [m.channels_last for m in loaded.modules() if isinstance(m, Quantize)] == \
        [m.channels_last for m in q.modules() if isinstance(m, Quantize)]
    x = _inputs(3, 7)
    assert torch.equal(loaded(*x), q(*x))
