"""Rebinding a converted model to the machine it runs on (after `qbackend.load`, or after changing
QBACKEND_ISA): activations requantized where the CPU needs 7-bit ones, and every layer routed
again by this machine's rules.

* Activations: a model converted where 8-bit activations are exact keeps them wherever this CPU
  has an exact route too (the native GEMM on every AVX2 CPU, oneDNN's depthwise convs). Where it
  has none (no AVX2: every uint8 value; a grouped conv without VNNI: that conv's input), the
  value's qparams are recomputed for [0, 127] from the float range saved with the model
  (`qbackend_activations`, the observer's chosen range; the range was chosen for 256 levels, the
  7-bit model uses it with 128). Every activation
  border (nn._activation.ActivationBorder: Quantize, Dequantize, the fused attention and LayerNorm,
  the int8 global average pool)
  and quantized layer reading or writing the value is updated.
* Routes: each static / dynamic layer goes through qbackend.dispatch.route with its recorded
  example shape (a forced provider stays forced), and its batch routes again where it was built
  with them (QuantConfig.route_by_batch); a layer whose provider or routes change is repacked.
  The layers of a fused block take the fusion's route (qbackend.dispatch.fusion_route) where this
  CPU has one, else their own: the block then runs them one by one.
  A dynamic LSTM's products are routed again at the shapes they were packed for, unless forced
  (its dynamic activations take 7 bits where a provider needs them, so every provider is exact).
"""
from __future__ import annotations

import warnings

import torch

from ..core.records import lstm_note
from ..core.routes import BatchRoutes
from ..dispatch import exact_route_exists, fusion_route, noting_seven_bit_weights, route, seven_bit_weights
from ..ops.embedding import get_embedding_provider
from ..nn import (DynamicQuantizedLinear, DynamicQuantizedLSTM, QuantizedConv2d, QuantizedEmbedding,
                  QuantizedEmbeddingBag, QuantizedLinear, TokenQuantizedLinear)
from ..nn.inverted_residual import QuantizedInvertedResidual
from ..nn.activation import ActivationBorder, StaticQParamsMixin, uses_8_bits
from ..nn.weights import is_seven_bit
from ..observers import choose_qparams, default_reduce_range
from ..ops import PackedConv2dWeight


class RequantizedWarning(UserWarning):
    """A loaded model's 8-bit activations were requantized to 7 bits for this CPU."""


def requantize_activations(qmodel, seven_bit: bool, only=None) -> list[str]:
    """Make every uint8 activation (or those named in `only`) 7-bit (seven_bit=True) where it is
    8-bit; returns the values changed."""
    if not seven_bit:
        return []
    new = {}
    for name, rec in qmodel.qbackend_activations.items():
        if rec.dtype != "uint8" or rec.qmax <= 127 or (only is not None and name not in only):
            continue
        lo, hi = rec.range
        new[name] = choose_qparams(lo, hi, torch.uint8, rec.symmetric, rec.qmin, 127, reduce_range=False, eps=rec.eps)
        rec.qmax = 127
    if not new:
        return []
    for m in qmodel.modules():
        if isinstance(m, ActivationBorder):
            if m.value in new:
                qp = new[m.value]
                m.set_qparams(qp.scale, qp.zero_point, qp.qmax)
            if getattr(m, "x_value", None) in new:  # a border that also reads an int8 value
                m.set_input_qparams(new[m.x_value].scale, new[m.x_value].zero_point)
        elif isinstance(m, StaticQParamsMixin):
            if m.x_value in new:
                m.set_input_qparams(new[m.x_value].scale, new[m.x_value].zero_point)
            if m.out_value in new:
                qp = new[m.out_value]
                m.set_output_qparams(qp.scale, qp.zero_point, qp.qmax)
            if m.accum_value in new:
                m.set_accum_qparams(new[m.accum_value].scale, new[m.accum_value].zero_point)
    return sorted(new)


def is_8bit_input(m: StaticQParamsMixin, activations: dict) -> bool:
    """Whether layer m's input uses the full 8-bit range, from the saved activation table."""
    rec = activations.get(m.x_value)
    return uses_8_bits(m.x_dtype, None if rec is None else rec.qmax)


def _repack(m, provider: str, routes: BatchRoutes | None):
    state = dict(m.packed.__getstate__(), batch_routes=routes)
    if isinstance(m.packed, PackedConv2dWeight):  # oneDNN picks its weight format for these qparams
        state["x_qparams"] = (m.x_scale, m.x_zero_point)
    return type(m.packed).from_state(state, provider)


def _record(info, r, old: str) -> None:
    """The record of a layer routed again: its new route, and where it ran before if that moved."""
    info.route, info.note = r, None
    info.rerouted_from = old if r.provider != old else None


def _fused_block(qmodel, path: str | None):
    """The fused block whose layer lives at `path`, or None."""
    parent = (path or "").rpartition(".")[0]
    m = qmodel.inner.get_submodule(parent) if parent else None
    return m if isinstance(m, QuantizedInvertedResidual) else None


def reroute(qmodel) -> dict[str, tuple[str, str]]:
    """Route every layer again on this machine; returns {layer: (old provider, new provider)} of the
    changed. A layer whose route stays keeps its record (a tuned one its timings); a record without
    a route (saved before routes were recorded) gets this machine's."""
    changed = {}
    for name, info in qmodel.qbackend_layers.items():
        m = qmodel.layer(name)
        block = _fused_block(qmodel, info.module)
        block_route = fusion_route(block.CHAIN) if block is not None else None
        if block is not None:
            block.fused = block_route is not None
        if block_route is not None:
            r = block_route  # the block's layers stay together on its provider
            stale_hint = (m.packed.x_qparams is not None and tuple(m.packed.x_qparams) != (m.x_scale, m.x_zero_point))
        elif isinstance(m, (QuantizedLinear, QuantizedConv2d)):
            eight = is_8bit_input(m, qmodel.qbackend_activations)
            r = route(info.kind, info.shape, eight_bit_input=eight, forced=info.forced, by_batch=info.route_by_batch)
            seven = seven_bit_weights(info.kind, info.shape, r) if is_seven_bit(m.packed.weight) else None
            if seven is not None:  # weights saved on 7 bits, which this CPU's native GEMM runs faster
                r = noting_seven_bit_weights(r, seven)
            stale_hint = (isinstance(m.packed, PackedConv2dWeight) and m.packed.x_qparams is not None
                          and tuple(m.packed.x_qparams) != (m.x_scale, m.x_zero_point))
        elif isinstance(m, DynamicQuantizedLinear):
            r = route("linear", info.shape, eight_bit_input=False, forced=info.forced, by_batch=info.route_by_batch)
            stale_hint = False
        elif isinstance(m, TokenQuantizedLinear):
            # its rows take 8-bit levels where a provider multiplies them exactly here, else 7-bit
            eight = exact_route_exists("linear", info.shape, info.forced)
            m.qmax = 255 if eight else 127
            if info.per_token is not None:
                info.per_token = {**info.per_token, "qmax": m.qmax}
            r = route("linear", info.shape, eight_bit_input=eight, forced=info.forced, by_batch=info.route_by_batch)
            stale_hint = False
        elif isinstance(m, DynamicQuantizedLSTM):
            old = m.provider_label
            if info.forced is None and m.reroute():
                info.note, info.rerouted_from = lstm_note(m.providers), old
                changed[name] = (old, m.provider_label)
            continue
        elif isinstance(m, (QuantizedEmbedding, QuantizedEmbeddingBag)):
            forced = info.forced
            if forced is not None and get_embedding_provider(forced).refuses_table(
                    m.packed.qparams_dtype, m.packed.bits, m.packed.dim, -1) is not None:
                forced = None  # forced where it was saved, not available here: the rules decide
            r = route("embedding_bag", info.shape, eight_bit_input=False, forced=forced)
            old = m.packed.saved_provider  # e.g. fbgemm_gpu, saved where it is installed
            if r.provider != m.packed.provider_name:
                m.packed = m.packed.with_provider(r.provider)
            if r.provider != old or info.route is None:
                _record(info, r, old)
            if r.provider != old:
                changed[name] = (old, r.provider)
            continue
        else:
            continue
        old, old_routes = m.packed.provider_name, m.packed.batch_routes
        routes = r.batch_routes
        if r.provider != old or routes != old_routes or stale_hint:
            m.packed = _repack(m, r.provider, routes)
        if r.provider != old or routes != old_routes or stale_hint or info.route is None \
                or (block is not None and info.route != r):  # a block's layers joining or leaving the fusion
            _record(info, r, old)
        if r.provider != old or routes != old_routes:
            changed[name] = (old, r.provider)
    return changed


def inexact_inputs(qmodel) -> set[str]:
    """The 8-bit input values of static layers that no provider runs exactly on this CPU."""
    out = set()
    for name, info in qmodel.qbackend_layers.items():
        m = qmodel.layer(name)
        if isinstance(m, (QuantizedLinear, QuantizedConv2d)) and is_8bit_input(m, qmodel.qbackend_activations) \
                and not exact_route_exists(info.kind, info.shape):
            out.add(m.x_value)
    return out


def rebind(qmodel) -> dict:
    """Requantize (where this CPU needs 7-bit activations) and re-route; returns what changed."""
    if default_reduce_range(torch.uint8):
        values = requantize_activations(qmodel, True)
    else:
        values = requantize_activations(qmodel, True, only=inexact_inputs(qmodel))
    if values:
        warnings.warn(f"qbackend: this model has 8-bit activations but this CPU (or QBACKEND_ISA) multiplies "
                      f"them exactly only with 7 bits for some layers; {len(values)} activation values were "
                      "requantized to 7 bits from their saved ranges", RequantizedWarning, stacklevel=3)
    return {"requantized": values, "rerouted": reroute(qmodel)}
