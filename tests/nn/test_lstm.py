"""DynamicQuantizedLSTM (qbackend/nn/lstm.py).

* Exactness against an independent float64 re-implementation (`ref_direction`) on the module's own
  integers: the int8 weights and scales the module holds, the float LSTM's biases (so the folding
  b_ih + b_hh is checked too), and the same per-call activation rule (uint8 over the input's own
  range, reference.choose_dynamic_qparams / quantize; 7-bit where the provider is not exact on
  8 bits). The recurrence can turn a float32 rounding difference into a one-step quantization flip
  of h, which then grows, so the reference is teacher-forced: step t quantizes the module's own
  h_{t-1} (the layer's output at the previous step), and layer l runs on the output of the module
  truncated to its first l layers (whose h_n / c_n must equal the full module's bit for bit). Only
  c is carried by the reference itself (in float64). What remains is the module's float32 gate math
  and epilogue (acc * x_scale * w_scale + bias): a few float32 roundings (2**-24 relative) of the
  gate terms per step, damped by sigmoid' <= 1/4 and tanh' <= 1, and carried in c (|c| grows up to
  ~T, so c is compared relative to max(1, |c|)) where the forget gate contracts earlier errors.
  Tolerance ATOL = 4e-6 on h and on c / max(1, |c|), for T <= 12 steps: the worst seen over ~50k
  random configurations (inputs scaled up to 20; both gate-math variants, see tanh_via_sigmoid) was
  4.7e-7 on h and 1.1e-6 on c, while a recurrent input off by 1e-4 relative gives 2e-5 and 7-bit
  instead of 8-bit input activations 6e-3.
* Against FP32 nn.LSTM: SQNR (output, h_n, c_n) >= 30 dB on random N(0, 1) data (observed
  38.8-47.4 dB with 8-bit activations (VNNI), 33.9-41.9 dB with 7-bit (QBACKEND_ISA=avx2)).
* Against torch.ao's dynamic quantized LSTM (quantize_dynamic: per-tensor weights, 7-bit
  activations everywhere): our SQNR vs FP32 is within 1 dB of theirs or better (observed 5.2-5.4 dB
  better with 8-bit activations, equal within 0.1 dB with 7-bit: on these uniformly initialised
  weights per-channel scales gain nothing; the gain is the 8th activation bit).
* Errors, save / copy, repr, torch.compile and torch.export, and QBACKEND_ISA=avx2 in a child.
"""
from __future__ import annotations

import copy
import io
import json
import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from qbackend.nn.lstm import DynamicQuantizedLSTM
from qbackend.observers import MinMaxObserver, PerChannelMinMaxObserver
from qbackend.ops import reference as R
from tests.ops.numerics import dynamic_reference_input
from tests.subprocess_utils import json_lines, run_py

ATOL = 4e-6
SQNR_MIN_DB = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_THREADS = torch.get_num_threads()
pytestmark = pytest.mark.usefixtures("one_thread")


def make_lstm(seed: int, input_size: int, hidden_size: int, **kw) -> nn.LSTM:
    torch.manual_seed(seed)
    return nn.LSTM(input_size, hidden_size, **kw).eval()


def sqnr(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (y - ref).pow(2).sum().clamp_min(1e-300)))


def time_major(t: torch.Tensor, batch_first: bool, batched: bool) -> torch.Tensor:
    """An input / output as [T, B, features]."""
    if not batched:
        return t.unsqueeze(1)
    return t.transpose(0, 1) if batch_first else t


def trunc_lstm(lstm: nn.LSTM, layers: int) -> nn.LSTM:
    """The float LSTM's first `layers` layers, with their weights."""
    small = nn.LSTM(lstm.input_size, lstm.hidden_size, num_layers=layers, bias=lstm.bias,
                    batch_first=lstm.batch_first, bidirectional=lstm.bidirectional).eval()
    sd = lstm.state_dict()
    small.load_state_dict({k: sd[k] for k in small.state_dict()})
    return small


# ----------------------------------------------------------------------------- the fp64 reference

def ref_direction(gx: torch.Tensor, w_hh: torch.Tensor, s_hh: torch.Tensor, h_module: torch.Tensor,
                  h0: torch.Tensor | None, c0: torch.Tensor | None, reverse: bool, reduce_range: bool):
    """fp64 LSTM recurrence of one direction. gx: [T, B, 4H] fp64 input projection (bias included);
    h_module: the module's h for every step [T, B, H] (teacher forcing). Returns (h [T, B, H], c_T)."""
    steps, batch, h4 = gx.shape
    hid = h4 // 4
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    c = torch.zeros(batch, hid, dtype=torch.float64) if c0 is None else c0.double()
    h_prev = torch.zeros(batch, hid) if h0 is None else h0
    hs = torch.empty(steps, batch, hid, dtype=torch.float64)
    for t in order:
        q, s, z = dynamic_reference_input(h_prev, reduce_range)
        gates = gx[t] + R.linear_fp64(q, s, z, w_hh, s_hh, None)
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        hs[t] = torch.sigmoid(o) * torch.tanh(c)
        h_prev = h_module[t]
    return hs, c


def quantized(lstm: nn.LSTM, provider=None, tanh_via_sigmoid=None) -> DynamicQuantizedLSTM:
    q = DynamicQuantizedLSTM.from_float(lstm, provider=provider)
    q.tanh_via_sigmoid = tanh_via_sigmoid
    return q


def check_against_reference(lstm: nn.LSTM, x: torch.Tensor, hx=None, provider=None, tanh_via_sigmoid=None) -> dict:
    """Run DynamicQuantizedLSTM.from_float(lstm) on x and compare it with the teacher-forced fp64
    reference, layer by layer; returns the largest differences seen."""
    q = quantized(lstm, provider, tanh_via_sigmoid)
    batched, bf = x.dim() == 3, lstm.batch_first
    d, hid, layers = q.num_directions, lstm.hidden_size, lstm.num_layers
    with torch.no_grad():
        out, (h_n, c_n) = q(x, hx)
    h0 = c0 = None
    if hx is not None:
        h0, c0 = (t if batched else t.unsqueeze(1) for t in hx)  # [L*D, B, H]
    # outs[k]: the output of the module truncated to its first k layers (the input of layer k)
    outs = {layers: out}
    for k in range(1, layers):
        sub = quantized(trunc_lstm(lstm, k), provider, tanh_via_sigmoid)
        assert sub.providers["ih"] == q.providers["ih"][:k]
        with torch.no_grad():
            outs[k], (sh, sc) = sub(x, None if hx is None else tuple(t[:k * d] for t in hx))
        assert torch.equal(sh, h_n[:k * d]) and torch.equal(sc, c_n[:k * d])
    worst = {"h": 0.0, "c": 0.0}
    for layer in range(layers):
        layer_in = x if layer == 0 else outs[layer]
        h_mod = time_major(outs[layer + 1], bf, batched)
        xin = time_major(layer_in, bf, batched)
        steps, batch = xin.shape[:2]
        wi = q.w_ih[layer]
        xq, xs, xz = dynamic_reference_input(xin.reshape(steps * batch, -1), not wi.exact_8bit)
        for di in range(d):
            rows = slice(di * 4 * hid, (di + 1) * 4 * hid)
            sfx = f"_l{layer}" + ("_reverse" if di else "")
            bias = (getattr(lstm, "bias_ih" + sfx).double() + getattr(lstm, "bias_hh" + sfx).double()
                    if lstm.bias else None)
            gx = R.linear_fp64(xq, xs, xz, wi.weight[rows], wi.w_scales[rows], None)
            if bias is not None:
                gx = gx + bias
            wh = q.w_hh[layer][di]
            idx = layer * d + di
            hs, c = ref_direction(gx.reshape(steps, batch, 4 * hid), wh.weight, wh.w_scales,
                                  h_mod[..., di * hid:(di + 1) * hid], None if h0 is None else h0[idx],
                                  None if c0 is None else c0[idx], di == 1, not wh.exact_8bit)
            dh = (hs - h_mod[..., di * hid:(di + 1) * hid].double()).abs().max().item()
            hn, cn = (h_n[idx], c_n[idx]) if batched else (h_n[idx].unsqueeze(0), c_n[idx].unsqueeze(0))
            last = 0 if di == 1 else steps - 1
            dh = max(dh, (hs[last] - hn.double()).abs().max().item())
            dc = (c - cn.double()).abs().max().item() / max(1.0, c.abs().max().item())  # |c| grows up to ~T
            worst = {"h": max(worst["h"], dh), "c": max(worst["c"], dc)}
    return worst


def check_weights(lstm: nn.LSTM, q: DynamicQuantizedLSTM) -> None:
    """The int8 weights are the per-channel symmetric quantization of the float ones: scale = f32(amax / 127.5)
    per output row, |dequant - w| <= scale / 2 (plus the float32 rounding of the scale, for the clamped
    largest magnitude, which lands on 127.5 levels)."""
    d, h4 = q.num_directions, 4 * lstm.hidden_size
    for layer in range(lstm.num_layers):
        for di in range(d):
            sfx = f"_l{layer}" + ("_reverse" if di else "")
            rows = slice(di * h4, (di + 1) * h4)
            for w, wq, s in ((getattr(lstm, "weight_ih" + sfx), q.w_ih[layer].weight[rows], q.w_ih[layer].w_scales[rows]),
                             (getattr(lstm, "weight_hh" + sfx), q.w_hh[layer][di].weight, q.w_hh[layer][di].w_scales)):
                w = w.detach().double()
                expected = (w.abs().amax(1) / 127.5).float()
                assert torch.equal(s, expected)
                err = (wq.double() * s.double()[:, None] - w).abs()
                assert (err <= s.double()[:, None] * (0.5 + 128 * 2.0**-23)).all()


# (name, lstm kwargs, T, B (None: unbatched), hx given)
CONFIGS = [
    ("plain", dict(), 9, 3, False),
    ("2layer_bi_batch_first_hx", dict(num_layers=2, bidirectional=True, batch_first=True), 7, 4, True),
    ("bi_nobias_unbatched_hx", dict(bidirectional=True, bias=False), 8, None, True),
    ("3layer_batch_first", dict(num_layers=3, batch_first=True), 6, 2, False),
]


def make_inputs(seed: int, lstm: nn.LSTM, steps: int, batch: int | None, hx: bool, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    d = 2 if lstm.bidirectional else 1
    if batch is None:
        x = torch.randn(steps, lstm.input_size, generator=g) * scale
        hshape = (lstm.num_layers * d, lstm.hidden_size)
    else:
        shape = (batch, steps) if lstm.batch_first else (steps, batch)
        x = torch.randn(*shape, lstm.input_size, generator=g) * scale
        hshape = (lstm.num_layers * d, batch, lstm.hidden_size)
    states = (torch.randn(hshape, generator=g) * 0.5, torch.randn(hshape, generator=g)) if hx else None
    return x, states


@pytest.mark.parametrize("tanh_via_sigmoid", [False, True], ids=["tanh", "via_sigmoid"])
@pytest.mark.parametrize("provider", ["fbgemm", "onednn"])
@pytest.mark.parametrize("name,kw,steps,batch,hx", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_fp64_reference(name, kw, steps, batch, hx, provider, tanh_via_sigmoid):
    lstm = make_lstm(1, 11, 20, **kw)
    x, states = make_inputs(2, lstm, steps, batch, hx)
    worst = check_against_reference(lstm, x, states, provider, tanh_via_sigmoid)
    assert worst["h"] <= ATOL and worst["c"] <= ATOL, worst


@settings(max_examples=12, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 2), bidirectional=st.booleans(), batch_first=st.booleans(), bias=st.booleans(),
       hx=st.booleans(), steps=st.integers(1, 12), batch=st.one_of(st.none(), st.integers(1, 5)),
       input_size=st.integers(1, 24), hidden=st.integers(1, 24), scale=st.sampled_from([0.05, 1.0, 6.0]),
       seed=st.integers(0, 2**20), provider=st.sampled_from([None, "fbgemm", "onednn"]),
       tanh_via_sigmoid=st.sampled_from([None, False, True]))
def test_matches_fp64_reference_random(layers, bidirectional, batch_first, bias, hx, steps, batch, input_size, hidden,
                                       scale, seed, provider, tanh_via_sigmoid):
    lstm = make_lstm(seed, input_size, hidden, num_layers=layers, bidirectional=bidirectional,
                     batch_first=batch_first, bias=bias)
    x, states = make_inputs(seed + 1, lstm, steps, batch, hx, scale)
    worst = check_against_reference(lstm, x, states, provider, tanh_via_sigmoid)
    assert worst["h"] <= ATOL and worst["c"] <= ATOL, worst


def test_weights_are_per_channel_int8():
    lstm = make_lstm(3, 13, 17, num_layers=2, bidirectional=True)
    q = DynamicQuantizedLSTM.from_float(lstm)
    check_weights(lstm, q)
    assert q.w_ih[0].bias is not None and q.w_ih[0].weight.dtype == torch.int8
    # bias folded: b_ih + b_hh in float64, rounded once
    b = torch.cat([lstm.bias_ih_l1.double() + lstm.bias_hh_l1.double(),
                   lstm.bias_ih_l1_reverse.double() + lstm.bias_hh_l1_reverse.double()]).float()
    assert torch.equal(q.w_ih[1].bias, b)


def test_weight_observer_instance_and_factory():
    lstm = make_lstm(4, 10, 12, bidirectional=True)
    x, _ = make_inputs(5, lstm, 6, 3, False)
    default = DynamicQuantizedLSTM.from_float(lstm)
    inst = PerChannelMinMaxObserver(dtype=torch.int8, symmetric=True, axis=0)
    inst.update(torch.randn(48, 10) * 100)  # stale statistics: must be reset, not merged
    q = DynamicQuantizedLSTM.from_float(lstm, weight_observer=inst)
    with torch.no_grad():
        assert torch.equal(q(x)[0], default(x)[0])
    per_tensor = DynamicQuantizedLSTM.from_float(lstm, weight_observer=lambda: MinMaxObserver(torch.int8, True))
    for w, rows in ((per_tensor.w_ih[0], 48), (per_tensor.w_hh[0][1], 48)):
        s = w.w_scales
        assert torch.equal(s[:rows], s[:1].expand(rows))  # one scale per (direction's) weight
    with torch.no_grad():
        assert sqnr(per_tensor(x)[0], lstm(x)[0]) > 25
    with pytest.raises(ValueError, match="int8 and symmetric"):
        DynamicQuantizedLSTM.from_float(lstm, weight_observer=lambda: MinMaxObserver(torch.uint8))
    with pytest.raises(TypeError, match="weight_observer"):
        DynamicQuantizedLSTM.from_float(lstm, weight_observer="minmax")


# ----------------------------------------------------------------------------- against FP32 and torch.ao

SQNR_CONFIGS = [
    ("plain", dict(), 16, 4, False),
    ("bidirectional", dict(bidirectional=True), 16, 4, False),
    ("2layer", dict(num_layers=2), 16, 4, False),
    ("batch_first_2layer_bi", dict(batch_first=True, num_layers=2, bidirectional=True), 16, 4, False),
    ("unbatched", dict(), 16, None, False),
    ("unbatched_batch_first_bi_h0c0", dict(batch_first=True, bidirectional=True), 16, None, True),
    ("h0c0", dict(num_layers=2), 16, 4, True),
    ("nobias", dict(bias=False), 16, 4, False),
]


@pytest.mark.parametrize("name,kw,steps,batch,hx", SQNR_CONFIGS, ids=[c[0] for c in SQNR_CONFIGS])
def test_sqnr_vs_fp32(name, kw, steps, batch, hx):
    lstm = make_lstm(6, 32, 48, **kw)
    x, states = make_inputs(7, lstm, steps, batch, hx)
    q = DynamicQuantizedLSTM.from_float(lstm)
    with torch.no_grad():
        y, (h, c) = q(x, states)
        yr, (hr, cr) = lstm(x, states)
    assert y.shape == yr.shape and h.shape == hr.shape and c.shape == cr.shape
    for got, ref in ((y, yr), (h, hr), (c, cr)):
        assert sqnr(got, ref) >= SQNR_MIN_DB, (name, sqnr(y, yr), sqnr(h, hr), sqnr(c, cr))


class _Holder(nn.Module):
    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x, hx=None):
        return self.lstm(x, hx)


def ao_dynamic(lstm: nn.LSTM) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(_Holder(copy.deepcopy(lstm)), {nn.LSTM}, dtype=torch.qint8)


AO_CONFIGS = [("plain", dict(), False), ("2layer_bi_h0c0", dict(num_layers=2, bidirectional=True), True),
              ("batch_first", dict(batch_first=True), False)]


@pytest.mark.parametrize("name,kw,hx", AO_CONFIGS, ids=[c[0] for c in AO_CONFIGS])
def test_sqnr_vs_torch_ao(name, kw, hx):
    lstm = make_lstm(8, 64, 96, **kw)
    x, states = make_inputs(9, lstm, 24, 8, hx)
    q, ao = DynamicQuantizedLSTM.from_float(lstm), ao_dynamic(lstm)
    with torch.no_grad():
        ref, ours, theirs = lstm(x, states)[0], q(x, states)[0], ao(x, states)[0]
    assert sqnr(ours, ref) >= sqnr(theirs, ref) - 1.0, (sqnr(ours, ref), sqnr(theirs, ref))


# ----------------------------------------------------------------------------- errors

def test_errors():
    lstm = make_lstm(10, 8, 6, num_layers=2, dropout=0.3)
    q = DynamicQuantizedLSTM.from_float(lstm)
    x = torch.randn(5, 3, 8)
    with pytest.raises(ValueError, match="proj_size"):
        DynamicQuantizedLSTM.from_float(nn.LSTM(8, 6, proj_size=3))
    with pytest.raises(TypeError, match="nn.LSTM"):
        DynamicQuantizedLSTM.from_float(nn.GRU(8, 6))
    with pytest.raises(TypeError, match="PackedSequence"):
        q(pack_padded_sequence(x, torch.tensor([5, 4, 2])))
    with pytest.raises(TypeError, match="float32"):
        q(x.double())
    with pytest.raises(TypeError, match="float32"):
        q(x.bfloat16())
    with pytest.raises(ValueError, match="CPU"):
        q(x.to("meta"))
    with pytest.raises(ValueError, match="input_size 8"):
        q(torch.randn(5, 3, 9))
    with pytest.raises(ValueError, match="3-D"):
        q(torch.randn(2, 5, 3, 8))
    with pytest.raises(ValueError, match="at least one time step"):
        q(torch.randn(0, 3, 8))
    with pytest.raises(ValueError, match=r"h0 must have shape \(2, 3, 6\)"):
        q(x, (torch.zeros(2, 2, 6), torch.zeros(2, 3, 6)))
    with pytest.raises(ValueError, match=r"c0 must have shape \(2, 6\)"):
        q(x[:, 0], (torch.zeros(2, 6), torch.zeros(2, 1, 6)))
    with pytest.raises(TypeError, match="c0 must be float32"):
        q(x, (torch.zeros(2, 3, 6), torch.zeros(2, 3, 6, dtype=torch.float64)))
    with pytest.raises(TypeError, match=r"tuple \(h0, c0\)"):
        q(x, torch.zeros(2, 3, 6))
    with pytest.raises(RuntimeError, match="no autograd"):
        q(x.clone().requires_grad_())
    with torch.no_grad():
        assert q(x.clone().requires_grad_())[0].shape == (5, 3, 6)
    q.train()
    with pytest.raises(RuntimeError, match="dropout"):
        q(x)
    with pytest.raises(ValueError, match="example_shape"):
        DynamicQuantizedLSTM.from_float(lstm, example_shape=(5, 3, 7))
    with pytest.raises(ValueError, match="unknown provider"):
        DynamicQuantizedLSTM.from_float(lstm, provider="mkl")


# ----------------------------------------------------------------------------- save, copy, repr, providers

def test_deepcopy_save_load_repr():
    lstm = make_lstm(11, 12, 16, num_layers=2, bidirectional=True, batch_first=True)
    q = DynamicQuantizedLSTM.from_float(lstm, provider={"ih": "onednn", "hh": "fbgemm"})
    x, states = make_inputs(12, lstm, 5, 3, True)
    with torch.no_grad():
        y = q(x, states)
    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (copy.deepcopy(q), loaded):
        assert other.w_ih[0] is not q.w_ih[0] and other.w_ih[0].packed is not q.w_ih[0].packed
        assert other.providers == q.providers == {"ih": ["onednn"] * 2, "hh": ["fbgemm"] * 4}
        with torch.no_grad():
            yo = other(x, states)
        assert torch.equal(yo[0], y[0]) and torch.equal(yo[1][0], y[1][0]) and torch.equal(yo[1][1], y[1][1])
    r = repr(q)
    for part in ("DynamicQuantizedLSTM(12, 16", "num_layers=2", "batch_first=True", "bidirectional=True",
                 "int8 per-channel", "ih=onednn", "hh=fbgemm", "-bit"):
        assert part in r, r
    moved = q.with_provider("fbgemm")
    assert moved.providers == {"ih": ["fbgemm"] * 2, "hh": ["fbgemm"] * 4} and q.providers["ih"] == ["onednn"] * 2
    with torch.no_grad():
        assert sqnr(moved(x, states)[0], y[0]) > 60  # same integers; float32 epilogues may round differently


def test_default_provider_follows_rules():
    from qbackend.dispatch import route

    def routed(m, k, n):
        return route("linear", {"m": m, "k": k, "n": n}, eight_bit_input=False).provider

    lstm = make_lstm(13, 128, 256, num_layers=2)
    q = DynamicQuantizedLSTM.from_float(lstm, example_shape=(64, 32, 128))
    assert q.providers["ih"] == [routed(2048, k, 1024) for k in (128, 256)]
    assert q.providers["hh"] == [routed(32, 256, 1024)] * 2
    q1 = DynamicQuantizedLSTM.from_float(lstm)  # default: batch 1, T 64
    assert q1.providers["hh"] == [routed(1, 256, 1024)] * 2


def test_reroute_repacks_the_products_whose_rule_differs():
    from qbackend.dispatch import route

    lstm = make_lstm(13, 128, 256, num_layers=2)
    q = DynamicQuantizedLSTM.from_float(lstm, example_shape=(64, 32, 128))
    ruled = q.providers
    assert not q.reroute() and q.providers == ruled  # routed here already: nothing moves
    # packed elsewhere, every product on a provider the rules do not give it here
    other = {"ih": next(p for p in ("onednn", "fbgemm") if p not in ruled["ih"]),
             "hh": next(p for p in ("onednn", "fbgemm") if p not in ruled["hh"])}
    moved = q.with_provider(other)
    x = torch.randn(64, 32, 128, generator=torch.Generator().manual_seed(4))
    assert moved.reroute() and moved.providers == ruled
    assert [w.x_shape for w in moved.w_ih] == [w.x_shape for w in q.w_ih]  # repacked for the same example
    assert route("linear", {"m": 2048, "k": 128, "n": 1024}, eight_bit_input=False).provider == ruled["ih"][0]
    with torch.no_grad():
        for a, b in zip(moved(x), q(x)):  # the same products: equal up to the providers' int32 -> fp32 epilogue
            a, b = (a, b) if isinstance(a, torch.Tensor) else (a[0], b[0])
            assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


# ----------------------------------------------------------------------------- torch.compile / export

@pytest.mark.parametrize("tanh_via_sigmoid", [False, True], ids=["tanh", "via_sigmoid"])
def test_torch_compile_and_export_match_eager(tanh_via_sigmoid):
    lstm = make_lstm(14, 10, 12, num_layers=2, bidirectional=True, batch_first=True)
    q = quantized(lstm, tanh_via_sigmoid=tanh_via_sigmoid)
    x, states = make_inputs(15, lstm, 4, 2, True)
    with torch.no_grad():
        ref = q(x, states)
        runs = []
        for backend, fullgraph in (("eager", False), ("aot_eager", True)):
            torch._dynamo.reset()
            runs.append(torch.compile(q, backend=backend, fullgraph=fullgraph)(x, states))
        torch._dynamo.reset()
        runs.append(torch.export.export(q, (x, states)).module()(x, states))
    for y in runs:
        assert torch.equal(y[0], ref[0]) and torch.equal(y[1][0], ref[1][0]) and torch.equal(y[1][1], ref[1][1])


# ----------------------------------------------------------------------------- QBACKEND_ISA=avx2

_AVX2_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
from tests.nn.test_lstm import check_against_reference, make_inputs, make_lstm, sqnr, ao_dynamic
from qbackend.nn.lstm import DynamicQuantizedLSTM
import qbackend
lstm = make_lstm(1, 11, 20, num_layers=2, bidirectional=True, batch_first=True)
x, states = make_inputs(2, lstm, 7, 4, True)
worst = [check_against_reference(lstm, x, states, p) for p in ("fbgemm", "onednn", None)]
big = make_lstm(8, 64, 96, num_layers=2)
xb, _ = make_inputs(9, big, 24, 8, False)
q = DynamicQuantizedLSTM.from_float(big)
with torch.no_grad():
    ref = big(xb)[0]
    ours, theirs = sqnr(q(xb)[0], ref), sqnr(ao_dynamic(big)(xb)[0], ref)
print(json.dumps({{"isa": qbackend.cpu_features().isa_class, "exact": [w.exact_8bit for w in q.w_ih],
                  "repr": repr(q), "worst": worst, "ours": ours, "theirs": theirs}}))
"""


def test_avx2_child_routes_by_the_rules_and_matches_reference():
    """Under QBACKEND_ISA=avx2 the input projections (M = 192) take the exact native GEMM on 8-bit
    inputs (FBGEMM's 7-bit route is within X_7BIT there), every provider matches the reference, and
    the output is no worse than torch.ao's."""
    proc = run_py(_AVX2_CHILD.format(root=ROOT), env={"QBACKEND_ISA": "avx2"}, check=True)
    (r,) = json_lines(proc)
    assert r["isa"] == "avx2" and r["exact"] == [True, True] and "(7-bit)" not in r["repr"], r
    for worst in r["worst"]:
        assert worst["h"] <= ATOL and worst["c"] <= ATOL, r
    assert r["ours"] >= SQNR_MIN_DB and r["ours"] >= r["theirs"] - 1.0, r
    print(json.dumps({k: r[k] for k in ("ours", "theirs")}))
