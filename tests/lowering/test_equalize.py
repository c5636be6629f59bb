"""Cross-layer equalization (qbackend/lowering/equalize.py): exact in FP32 (the prepared graph's
outputs are the model's, within fp32 rounding), the pairs' channel ranges equal afterwards, pairs
through ReLU6 or with another reader left alone, and a model whose channels are badly balanced
(a rescaling that leaves its FP32 function unchanged) quantized far closer to FP32 with it."""
from __future__ import annotations

import torch
from torch import nn

import qbackend
from qbackend.lowering.capture import capture
from qbackend.lowering.equalize import _pairs, equalize
from qbackend.lowering.fold import fold_batchnorm, get_attr_value

from .toy_models import InvertedResidual, ResidualCNN, init_bn, sqnr


class Pair(nn.Module):
    """conv -> ReLU -> conv -> ReLU -> linear head, the middle channels scaled by `spread` decades
    (conv1's output channel i by 10^u_i, conv2's input channel i by 10^-u_i: the FP32 function of
    the unscaled model, per-tensor int8 activations between them much worse)."""

    def __init__(self, spread: float = 0.0, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            u = 10.0 ** (spread * (torch.rand(16, generator=g) - 0.5))
            self.conv1.weight.mul_(u.view(-1, 1, 1, 1))
            self.conv1.bias.mul_(u)
            self.conv2.weight.div_(u.view(1, -1, 1, 1))

    def forward(self, x):
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(y.mean((2, 3)))


def _graph(model, x):
    gm = capture(model, (x,), {}, "auto")
    fold_batchnorm(gm)
    return gm


def test_equalization_is_exact_in_fp32_and_evens_the_pairs_ranges():
    torch.manual_seed(0)
    model = init_bn(ResidualCNN(c=8))
    x = torch.randn(2, 3, 16, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gm = _graph(model, x)
    pairs = _pairs(gm)
    assert len(pairs) == 2  # each block's first conv -> ReLU -> second conv; the residual adds are not
    assert equalize(gm) == 2
    out = gm(x)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, model(x), rtol=1e-5, atol=1e-5)
    for first, readers in _pairs(gm):
        w1 = get_attr_value(gm, first.args[1]).double()
        r1 = w1.reshape(w1.shape[0], -1).abs().amax(1)
        r2 = torch.stack([get_attr_value(gm, r.args[1]).double().transpose(0, 1).reshape(w1.shape[0], -1)
                          .abs().amax(1) for r in readers]).amax(0)
        torch.testing.assert_close(r1, r2, rtol=1e-3, atol=0.0)
    # the prepared model (observers on) still computes the model
    prepared = qbackend.prepare(model, (x,), config=qbackend.QuantConfig(equalization=True))
    torch.testing.assert_close(prepared(x), model(x), rtol=1e-5, atol=1e-5)
    after = model.state_dict()  # the model's own parameters untouched
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_relu6_pairs_and_shared_values_are_left_alone():
    torch.manual_seed(1)
    model = init_bn(InvertedResidual(c=8, t=4))
    gm = _graph(model, torch.randn(2, 3, 8, 8))
    assert _pairs(gm) == []  # ReLU6 between every pair, and the stem's output also feeds the residual add


def test_equalization_recovers_badly_balanced_channels():
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(8, 3, 12, 12, generator=g),) for _ in range(6)]
    model = Pair(spread=3.0).eval()
    balanced = Pair(spread=0.0).eval()
    torch.testing.assert_close(model(*data[0]), balanced(*data[0]), rtol=1e-4, atol=1e-4)  # same function
    with torch.no_grad():
        ref = torch.cat([model(*d) for d in data[4:]])
    out = {}
    for eq in (False, True):
        q = qbackend.quantize(model, data[0], data[:4], config=qbackend.QuantConfig(equalization=eq))
        with torch.no_grad():
            out[eq] = sqnr(ref, torch.cat([q(*d) for d in data[4:]]))
    assert out[True] > out[False] + 6.0, out


def test_config_checks_equalization():
    import pytest

    with pytest.raises(TypeError, match="equalization must be True or False"):
        qbackend.QuantConfig(equalization="yes")
