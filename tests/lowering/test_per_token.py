"""Per-token inputs in the lowering (lowering/per_token.py): which Linears read their input per
token, what the converted model then is, and that it is exact on its integers, saved and loaded,
and closer to FP32 where tokens carry the outliers."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import QuantizedLinear, TokenQuantizedLinear
from qbackend.lowering import per_token

from .layer_reference import check_layers


class FFN(nn.Module):
    """A transformer block's feed-forward: x + down(gelu(up(x)))."""

    def __init__(self, d: int = 64, h: int = 256):
        super().__init__()
        self.up, self.act, self.down = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


def _batches(outlier_tokens: bool, n: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(4, 16, 64, generator=g)
        if outlier_tokens:
            x[:, 0] *= 30  # the first token of every sequence: massive activations
        out.append((x,))
    return out


@pytest.fixture(scope="module")
def ffn():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return FFN().eval()


def _quantize(model, data, **config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qbackend.quantize(model, data[0], data[:4], config=qbackend.QuantConfig(**config))


def _sqnr(ref, y):
    return float(10 * torch.log10(ref.double().pow(2).sum() / (ref.double() - y.double()).pow(2).sum()))


def test_outlier_tokens_choose_per_token_and_it_is_closer_to_fp32(ffn):
    data = _batches(outlier_tokens=True)
    auto, static = _quantize(ffn, data), _quantize(ffn, data, per_token_inputs=False)
    assert isinstance(auto.layer("down"), TokenQuantizedLinear) and isinstance(static.layer("down"), QuantizedLinear)
    rec = auto.qbackend_layers["down"].per_token
    assert rec["qmax"] in (255, 127) and rec["gain_db"] >= 10 * torch.log10(torch.tensor(per_token.PER_TOKEN_GAIN))
    assert auto.qbackend_layers["up"].output == "float32" and static.qbackend_layers["up"].output == "int8"
    assert "up.output" not in auto.qbackend_activations and "up.output" in static.qbackend_activations
    x = data[4][0]  # held out
    ref = ffn(x)
    with torch.no_grad():
        assert _sqnr(ref, auto(x)) > _sqnr(ref, static(x)) + 1.0
    assert check_layers(auto, x) == 2  # up (int8 in, float32 out) and down (per token) on their integers


def test_auto_chooses_it_only_at_the_threshold_gain(ffn, monkeypatch):
    data = _batches(outlier_tokens=False)
    gain_db = _quantize(ffn, data, per_token_inputs=True).qbackend_layers["down"].per_token["gain_db"]
    monkeypatch.setattr(per_token, "PER_TOKEN_GAIN", 10 ** (gain_db / 10) * 1.02)
    q = _quantize(ffn, data)
    assert isinstance(q.layer("down"), QuantizedLinear) and q.qbackend_layers["down"].per_token is None
    assert q.qbackend_layers["up"].output == "int8"
    monkeypatch.setattr(per_token, "PER_TOKEN_GAIN", 10 ** (gain_db / 10) * 0.98)
    assert isinstance(_quantize(ffn, data).layer("down"), TokenQuantizedLinear)


def test_true_forces_it_and_false_or_an_override_refuses_it(ffn):
    data = _batches(outlier_tokens=False)
    forced = _quantize(ffn, data, per_token_inputs=True)
    assert isinstance(forced.layer("down"), TokenQuantizedLinear)
    assert forced.qbackend_layers["down"].per_token["gain_db"] is not None
    check_layers(forced, data[4][0])
    outliers = _batches(outlier_tokens=True)
    off = qbackend.QuantConfig(per_token_inputs=False)
    for q in (_quantize(ffn, outliers, per_token_inputs=False),
              _quantize(ffn, outliers, by_name={"down": off})):
        assert isinstance(q.layer("down"), QuantizedLinear)


def test_a_value_another_layer_reads_in_int8_is_no_candidate():
    class Fork(nn.Module):  # up's output read by a and b, and b writes int8 for c
        def __init__(self):
            super().__init__()
            self.up, self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(64, 32), nn.Linear(32, 32)

        def forward(self, x):
            h = torch.relu(self.up(x))
            return self.a(h) + self.c(self.b(h))

    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = Fork().eval()
    data = [(torch.randn(4, 8, 32) * torch.tensor([30.0] + [1.0] * 7)[None, :, None],) for _ in range(5)]
    q = _quantize(model, data, per_token_inputs=True)
    assert isinstance(q.layer("a"), QuantizedLinear) and isinstance(q.layer("b"), QuantizedLinear)
    assert q.qbackend_layers["up"].output == "int8"
    assert isinstance(q.layer("c"), TokenQuantizedLinear)  # b's output: c alone reads it
    check_layers(q, data[4][0])


def test_saved_and_loaded_gives_the_same_outputs(ffn, tmp_path):
    data = _batches(outlier_tokens=True)
    q = _quantize(ffn, data)
    path = tmp_path / "ffn.qb"
    qbackend.save(q, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q2 = qbackend.load(path)
    assert isinstance(q2.layer("down"), TokenQuantizedLinear)
    assert q2.qbackend_layers["down"].per_token == q.qbackend_layers["down"].per_token
    x = data[4][0]
    with torch.no_grad():
        assert torch.equal(q(x), q2(x))


def test_forward_plan_replays_it_bit_for_bit(ffn):
    data = _batches(outlier_tokens=True)
    q = _quantize(ffn, data)
    x = data[4][0]
    with torch.no_grad():
        q.forward_plans = False
        eager = q(x)
        q.forward_plans = True
        outs = [q(x) for _ in range(3)]  # recorded on the second call, replayed on the third
    assert all(torch.equal(eager, y) for y in outs)


def test_config_value_is_checked():
    with pytest.raises(ValueError, match="per_token_inputs must be 'auto', True or False"):
        qbackend.QuantConfig(per_token_inputs="always")
