"""DynamicQuantizedLSTM: nn.LSTM with int8 weights and dynamically quantized activations.

Weights: W_ih and W_hh of every layer and direction are quantized once, int8 symmetric per output
channel (by default `PerChannelMinMaxObserver(int8, symmetric, axis=0)`), into
`qbackend.ops.PackedLinearWeight`s. Activations: every matrix product quantizes its fp32 input to
uint8 over that input's own range at run time (`PackedLinearWeight.linear_dynamic`, the rule of
`qbackend.ops.reference.choose_dynamic_qparams`; 7-bit where the provider would saturate 8-bit
products, i.e. on CPUs without VNNI or under QBACKEND_ISA=avx2). Per layer:

  gates_x = W_ih x + (b_ih + b_hh)      ONE dynamic linear over all T*B rows and both directions
                                        (W_ih of the two directions stacked: [D*4H, in]); the
                                        activation qparams cover the whole layer input
  per time step t, per direction:
  gates   = gates_x[t] + W_hh h         one dynamic linear [B, H] -> [B, 4H], qparams from h
  i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of the gate chunks (fp32, nn.LSTM's order)
  c = f * c + i * g;  h = o * tanh(c)
  (from batch * hidden >= 4096 on, tanh(x) is computed as 2 sigmoid(2x) - 1, which torch runs
  several times faster; it differs by ~1e-7 absolute. `tanh_via_sigmoid` = True / False forces
  either variant.)

When no (h0, c0) is given the first step skips W_hh h (h = 0 makes it exactly 0).

Layout of the packed weights: `w_ih[layer]` holds the directions stacked (rows
[d*4H, (d+1)*4H) are direction d, d = 1 the reverse one) with the folded bias b_ih + b_hh (added
in float64, rounded once to float32; None with bias=False); `w_hh[layer][d]` has no bias.

Semantics follow nn.LSTM (eval mode) for batch_first True/False, num_layers >= 1, bidirectional,
bias True/False, optional (h0, c0), and unbatched 2-D input; `forward` returns
(output, (h_n, c_n)). Not supported: proj_size > 0 (ValueError in `from_float`), PackedSequence
input (TypeError: pad it, or run sequences of one length together), autograd (the int8 ops have no
backward: RuntimeError for inputs or states that require grad while grad mode is on). Input and
states must be float32 CPU tensors.

This is an inference module: dropout between layers is never applied. `from_float` returns it in
eval mode; `forward` in training mode raises RuntimeError when the float LSTM would have applied
dropout (dropout > 0 and num_layers > 1), and is the eval forward otherwise.

Saving: the packed weights are plain Python attributes (not parameters or buffers, so
`state_dict()` is empty); they pickle as the int8 weight plus metadata and repack on load, so
`copy.deepcopy(m)` and `torch.save(m)` / `torch.load(..., weights_only=False)` work (repacked for
the saved providers; `with_provider` moves a module to another).

torch.compile / export (torch 2.13, measured by tests/nn/test_lstm.py and by hand):
  * torch.compile with fullgraph=False and fullgraph=True, backends "eager" and "aot_eager": no
    graph break; the time loop is unrolled (a new T recompiles) and the output is bit-identical to
    eager (the graph calls the same int8 kernels).
  * inductor (fullgraph too): it fuses the fp32 gate math, so results agree with eager to float32
    rounding, not bit for bit. Compiling the unrolled loop is slow (minutes for long sequences);
    the compiled module then beats eager (no Python per step): benchmarks/results/
    design_measurements.md, "LSTM under torch.compile".
  * torch.export.export: works for a fixed T (bit-identical); the packed tensors are constants of
    the program, which therefore does not serialize (see tests/ops/test_tracing.py): save the
    module instead.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from ..core.generation import Tracked
from ..dispatch import route
from ..observers import Observer, PerChannelMinMaxObserver
from ..ops import PackedLinearWeight
from .weights import quantize_weight

__all__ = ["DynamicQuantizedLSTM"]

# torch.tanh costs several times torch.sigmoid per float32 element on x86 in torch 2.13
# (benchmarks/results/design_measurements.md, "LSTM under torch.compile"): from this many state
# elements (batch * hidden) per step on, the gate math computes tanh(x) = 2 sigmoid(2x) - 1, which
# is faster despite its extra (cheap) ops; below it, the op count dominates and torch.tanh is
# faster. The two differ by ~1e-7 absolute (2 float32 ulps of 0.5).
TANH_VIA_SIGMOID_MIN_ELEMENTS = 4096

# The shape assumed for provider choice when from_float gets no example_shape: batch 1, 64 steps
# (m = 64 rows for the input projection, m = 1 for the recurrent one).
DEFAULT_EXAMPLE_T, DEFAULT_EXAMPLE_BATCH = 64, 1

WeightObserverSpec = Observer | Callable[[], Observer] | None


def _weight_observer(spec: WeightObserverSpec, name: str) -> Observer:
    """A fresh observer for one weight: the default, a reset deep copy of an instance, or a factory's product."""
    if spec is None:
        return PerChannelMinMaxObserver(dtype=torch.int8, symmetric=True, axis=0, name=name)
    if isinstance(spec, Observer):
        obs = copy.deepcopy(spec)
        obs.reset()
    elif callable(spec):
        obs = spec()
        if not isinstance(obs, Observer):
            raise TypeError(f"weight_observer factory must return a qbackend Observer, got {type(obs).__name__}")
    else:
        raise TypeError(f"weight_observer must be a qbackend Observer, a factory of one, or None, got "
                        f"{type(spec).__name__}")
    if obs.name is None:
        obs.name = name
    if obs.dtype != torch.int8 or not obs.symmetric:
        raise ValueError(f"{name}: the weight observer must be int8 and symmetric (the kernels take zero point 0), "
                         f"got {obs!r}")
    if getattr(obs, "_per_channel", False) and obs.axis not in (0, -2):
        raise ValueError(f"{name}: a per-channel weight observer must use axis 0 (output channels), got {obs.axis}")
    return obs


def _quantize_weight(w: torch.Tensor, spec: WeightObserverSpec, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 per-output-channel scales) of a float weight [N, K]."""
    return quantize_weight(w, _weight_observer(spec, name), name)


def _example_dims(example_shape, batch_first: bool, input_size: int) -> tuple[int, int]:
    """(T, batch) of an example input shape (as forward would get it), or the defaults."""
    if example_shape is None:
        return DEFAULT_EXAMPLE_T, DEFAULT_EXAMPLE_BATCH
    shape = tuple(int(s) for s in example_shape)
    if len(shape) == 2:
        t, b = shape[0], 1
    elif len(shape) == 3:
        t, b = (shape[1], shape[0]) if batch_first else (shape[0], shape[1])
    else:
        raise ValueError(f"example_shape must be an input shape (T, B, {input_size}), (B, T, {input_size}) with "
                         f"batch_first, or (T, {input_size}) unbatched; got {example_shape!r}")
    if shape[-1] != input_size or t < 1 or b < 1:
        raise ValueError(f"example_shape {example_shape!r} does not fit an LSTM with input_size {input_size}")
    return t, b


def _routed(m: int, k: int, n: int) -> str:
    """The provider the rules give one dynamic product (m rows, k x n weight) here."""
    return route("linear", {"m": m, "k": k, "n": n}, eight_bit_input=False).provider


def _choose_providers(provider, shapes: dict[str, tuple[int, int, int]]) -> dict[str, str]:
    """{"ih": name, "hh": name}: the given provider(s), or the route of each dynamic product (m, k, n)."""
    if isinstance(provider, str):
        return {"ih": provider, "hh": provider}
    if isinstance(provider, Mapping):
        if set(provider) - {"ih", "hh"}:
            raise ValueError(f"provider mapping keys must be 'ih' and/or 'hh', got {sorted(provider)}")
        chosen = dict(provider)
    elif provider is None:
        chosen = {}
    else:
        raise TypeError(f"provider must be a provider name, a {{'ih': ..., 'hh': ...}} mapping or None, got "
                        f"{type(provider).__name__}")
    for kind, (m, k, n) in shapes.items():
        if chosen.get(kind) is None:
            chosen[kind] = _routed(m, k, n)
    return chosen


class DynamicQuantizedLSTM(Tracked, nn.Module):
    """nn.LSTM with int8 per-channel weights and per-call dynamic uint8 activations (see the module docstring).

    Build with `from_float(lstm)`; or directly from packed weights: `w_ih[layer]` [D*4H, in_l]
    (directions stacked, folded bias), `w_hh[layer][d]` [4H, H].
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, w_ih: Sequence[PackedLinearWeight],
                 w_hh: Sequence[Sequence[PackedLinearWeight]], bias: bool = True, batch_first: bool = False,
                 bidirectional: bool = False, dropout: float = 0.0):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        self.dropout = float(dropout)
        self.proj_size = 0
        d, h = self.num_directions, self.hidden_size
        if self.num_layers < 1 or h < 1 or self.input_size < 1:
            raise ValueError("input_size, hidden_size and num_layers must be >= 1")
        if len(w_ih) != self.num_layers or len(w_hh) != self.num_layers:
            raise ValueError(f"need {self.num_layers} w_ih and w_hh entries, got {len(w_ih)} and {len(w_hh)}")
        for layer in range(self.num_layers):
            k = self.input_size if layer == 0 else d * h
            wi = w_ih[layer]
            if not isinstance(wi, PackedLinearWeight) or (wi.out_features, wi.in_features) != (d * 4 * h, k):
                raise ValueError(f"w_ih[{layer}] must be a PackedLinearWeight [{d * 4 * h}, {k}], got {wi!r}")
            if (wi.bias is not None) != self.bias:
                raise ValueError(f"w_ih[{layer}] {'lacks' if self.bias else 'has'} a bias but bias={self.bias}")
            if len(w_hh[layer]) != d:
                raise ValueError(f"w_hh[{layer}] must hold {d} direction(s), got {len(w_hh[layer])}")
            for di, wh in enumerate(w_hh[layer]):
                if not isinstance(wh, PackedLinearWeight) or (wh.out_features, wh.in_features) != (4 * h, h):
                    raise ValueError(f"w_hh[{layer}][{di}] must be a PackedLinearWeight [{4 * h}, {h}], got {wh!r}")
                if wh.bias is not None:
                    raise ValueError(f"w_hh[{layer}][{di}] must have no bias (b_hh is folded into w_ih)")
        # None: by size (TANH_VIA_SIGMOID_MIN_ELEMENTS); True / False force the gate-math variant
        self.tanh_via_sigmoid: bool | None = None
        # plain Python attributes (see the module docstring: they pickle as int8 + metadata)
        self.w_ih = list(w_ih)
        self.w_hh = [list(ws) for ws in w_hh]

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_float(cls, lstm: nn.LSTM, weight_observer: WeightObserverSpec = None,
                   provider: str | Mapping[str, str] | None = None,
                   example_shape: Sequence[int] | None = None) -> DynamicQuantizedLSTM:
        """Quantize a float nn.LSTM (in eval mode on return).

        weight_observer: an Observer (copied and reset for each weight), a factory returning one, or
          None for PerChannelMinMaxObserver(int8, symmetric, axis=0). Must be int8 symmetric.
        provider: a provider name for every product, {"ih": ..., "hh": ...}, or None to let the
          dispatch rules choose per product: the input projection with m = T*batch, the recurrent
          one with m = batch, from `example_shape` (an input shape as forward gets it; default
          batch 1, T 64).
        """
        if not isinstance(lstm, nn.LSTM):
            raise TypeError(f"from_float expects an nn.LSTM, got {type(lstm).__name__}")
        if lstm.proj_size > 0:
            raise ValueError(f"DynamicQuantizedLSTM does not support proj_size > 0 (got proj_size={lstm.proj_size})")
        d, h = 2 if lstm.bidirectional else 1, lstm.hidden_size
        t, b = _example_dims(example_shape, lstm.batch_first, lstm.input_size)
        w_ih, w_hh = [], []
        for layer in range(lstm.num_layers):
            k = lstm.input_size if layer == 0 else d * h
            prov = _choose_providers(provider, {"ih": (t * b, k, d * 4 * h), "hh": (b, h, 4 * h)})
            qs, scales, biases, hh = [], [], [], []
            for di in range(d):
                sfx = f"_l{layer}" + ("_reverse" if di else "")
                q, s = _quantize_weight(getattr(lstm, "weight_ih" + sfx), weight_observer, "weight_ih" + sfx)
                qs.append(q)
                scales.append(s)
                if lstm.bias:
                    biases.append(getattr(lstm, "bias_ih" + sfx).detach().double()
                                  + getattr(lstm, "bias_hh" + sfx).detach().double())
                qh, sh = _quantize_weight(getattr(lstm, "weight_hh" + sfx), weight_observer, "weight_hh" + sfx)
                hh.append(PackedLinearWeight(qh, sh, None, provider=prov["hh"], x_shape=[b, h]))
            bias = torch.cat(biases).float() if lstm.bias else None
            w_ih.append(PackedLinearWeight(torch.cat(qs), torch.cat(scales), bias, provider=prov["ih"],
                                           x_shape=[t * b, k]))
            w_hh.append(hh)
        return cls(lstm.input_size, h, lstm.num_layers, w_ih, w_hh, bias=lstm.bias, batch_first=lstm.batch_first,
                   bidirectional=lstm.bidirectional, dropout=lstm.dropout).eval()

    def with_provider(self, provider: str | Mapping[str, str]) -> DynamicQuantizedLSTM:
        """A copy with every packed weight repacked for `provider` (a name, or {"ih": ..., "hh": ...})."""
        prov = provider if isinstance(provider, Mapping) else {"ih": provider, "hh": provider}
        w_ih = [w.with_provider(prov["ih"]) if prov.get("ih") else copy.deepcopy(w) for w in self.w_ih]
        w_hh = [[w.with_provider(prov["hh"]) if prov.get("hh") else copy.deepcopy(w) for w in ws] for ws in self.w_hh]
        new = type(self)(self.input_size, self.hidden_size, self.num_layers, w_ih, w_hh, bias=self.bias,
                         batch_first=self.batch_first, bidirectional=self.bidirectional, dropout=self.dropout)
        new.tanh_via_sigmoid = self.tanh_via_sigmoid
        return new.train(self.training)

    def reroute(self) -> bool:
        """Route each product again on this CPU (the rules at the shape its weight was packed for:
        the example's rows) and repack the weights whose provider changes; whether any did."""
        changed = False

        def again(w: PackedLinearWeight) -> PackedLinearWeight:
            nonlocal changed
            provider = _routed(int(w.x_shape[0]) if w.x_shape else 1, w.in_features, w.out_features)
            if provider == w.provider_name:
                return w
            changed = True
            return w.with_provider(provider)

        self.w_ih = [again(w) for w in self.w_ih]
        self.w_hh = [[again(w) for w in ws] for ws in self.w_hh]
        return changed

    def flatten_parameters(self) -> None:
        """No-op (nn.LSTM API compatibility)."""

    # ------------------------------------------------------------------ forward

    def _check_state(self, t, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor, got device {t.device}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        return t.contiguous()

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if isinstance(input, PackedSequence):
            raise TypeError("DynamicQuantizedLSTM does not support PackedSequence input; pass a padded tensor "
                            "(torch.nn.utils.rnn.pad_packed_sequence) or run sequences of one length together")
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input must be a tensor, got {type(input).__name__}")
        if input.dtype != torch.float32:
            raise TypeError(f"DynamicQuantizedLSTM takes float32 input, got {input.dtype}")
        if input.device.type != "cpu":
            raise ValueError(f"DynamicQuantizedLSTM runs on the CPU, got input on {input.device}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input must be 3-D (batched) or 2-D (unbatched), got shape {tuple(input.shape)}")
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input.size(-1) must be equal to input_size {self.input_size}, got {input.shape[-1]}")
        if self.training and self.dropout > 0 and self.num_layers > 1:
            raise RuntimeError("DynamicQuantizedLSTM is an inference module and does not apply dropout; call "
                               ".eval() (the float LSTM has dropout > 0, which training mode would apply)")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        tdim = 1 if batched and self.batch_first else 0
        steps, batch = x.shape[tdim], x.shape[1 - tdim]
        if steps == 0 or batch == 0:
            raise ValueError(f"input must have at least one time step and one sequence, got shape {tuple(input.shape)}")
        d, h, layers = self.num_directions, self.hidden_size, self.num_layers
        h0 = c0 = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError("hx must be a tuple (h0, c0)")
            shape = (layers * d, batch, h) if batched else (layers * d, h)
            h0 = self._check_state(hx[0], "h0", shape)
            c0 = self._check_state(hx[1], "c0", shape)
            if not batched:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, h0, c0)):
            raise RuntimeError("DynamicQuantizedLSTM has no autograd (its int8 ops have no backward): run it "
                               "under torch.no_grad() / torch.inference_mode(), or pass tensors that do not "
                               "require grad")

        layer_in = x.contiguous()
        h_n, c_n = [], []
        for layer in range(layers):
            gates_x = self.w_ih[layer].linear_dynamic(layer_in)  # all steps and directions: [.., D*4H]
            outs = []
            for di in range(d):
                idx = layer * d + di
                out, hl, cl = self._direction(gates_x[..., di * 4 * h:(di + 1) * 4 * h], self.w_hh[layer][di],
                                              None if h0 is None else h0[idx], None if c0 is None else c0[idx],
                                              di == 1, tdim, steps)
                outs.append(out)
                h_n.append(hl)
                c_n.append(cl)
            layer_in = outs[0] if d == 1 else torch.cat(outs, dim=2)
        output, h_n, c_n = layer_in, torch.stack(h_n), torch.stack(c_n)
        if not batched:
            output, h_n, c_n = output.squeeze(1), h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)

    def _direction(self, gates_x: torch.Tensor, w_hh: PackedLinearWeight, h: torch.Tensor | None,
                   c: torch.Tensor | None, reverse: bool, tdim: int, steps: int):
        """One direction of one layer over all steps: (outputs stacked along tdim, h_T, c_T)."""
        hid = self.hidden_size
        batch = gates_x.shape[1 - tdim]
        via_sigmoid = self.tanh_via_sigmoid
        if via_sigmoid is None:
            via_sigmoid = batch * hid >= TANH_VIA_SIGMOID_MIN_ELEMENTS
        ts = range(steps - 1, -1, -1) if reverse else range(steps)
        out: list = [None] * steps
        for t in ts:
            gates = gates_x.select(tdim, t)
            if h is not None:  # h = None: the zero initial state, whose W_hh h is exactly 0
                gates = w_hh.linear_dynamic(h).add_(gates)
            if via_sigmoid:
                if h is None:
                    gates = gates.clone()  # a view of gates_x: do not write into it
                gates[:, 2 * hid:3 * hid].mul_(2)
                i, f, g, o = gates.sigmoid_().chunk(4, 1)
                g = g.mul_(2).sub_(1)  # tanh(g) = 2 sigmoid(2 g) - 1
                c = i * g if c is None else torch.addcmul(f * c, i, g)
                h = torch.sigmoid(c * 2).mul_(2).sub_(1).mul_(o)
            else:
                i, f, _, o = torch.sigmoid(gates).chunk(4, 1)
                g = torch.tanh(gates[:, 2 * hid:3 * hid])
                c = i * g if c is None else torch.addcmul(f * c, i, g)
                h = o * torch.tanh(c)
            out[t] = h
        return torch.stack(out, dim=tdim), h, c

    # ------------------------------------------------------------------ description

    @property
    def providers(self) -> dict[str, list[str]]:
        """The provider of each packed weight: {"ih": [per layer], "hh": [per layer and direction]}."""
        return {"ih": [w.provider_name for w in self.w_ih],
                "hh": [w.provider_name for ws in self.w_hh for w in ws]}

    @property
    def provider_label(self) -> str:
        """Its providers as one name ("fbgemm/native"), as explain shows them."""
        return "/".join(sorted({p for ps in self.providers.values() for p in ps}))

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.dropout:
            s += f", dropout={self.dropout} (not applied)"
        prov = {k: "/".join(dict.fromkeys(v)) for k, v in self.providers.items()}
        weights = [w for w in self.w_ih] + [w for ws in self.w_hh for w in ws]
        bits = 8 if all(w.exact_8bit for w in weights) else 7
        return (s + f", weights=int8 per-channel symmetric, activations=uint8 dynamic per call ({bits}-bit), "
                f"providers: ih={prov['ih']} hh={prov['hh']}")
