"""The records of a converted model (qbackend.core.records), built in this one place: a Linear or
Conv2d layer from its LayerSpec (graph capture and module swap alike), an embedding table, an
LSTM, and the activation record of an observed value."""
from __future__ import annotations

import math

import torch

from ..config import EmbeddingConfig
from ..core.records import WEIGHT_ONLY_NOTE, ActivationRecord, EmbeddingInfo, LayerRecord, lstm_note
from ..core.routes import Route
from ..observers import Observer, QParams
from .layer_spec import LayerSpec


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def layer_record(spec: LayerSpec, module: str, route: Route | None, output: str, by_batch: bool) -> LayerRecord:
    """A Linear / Conv2d layer built from `spec` (route None: weight-only, float compute);
    by_batch: whether loading routes it by call size again (not for tuned layers)."""
    return LayerRecord(kind=spec.kind, mode=spec.config.mode, module=module, post_op=spec.post_op,
                       residual=spec.residual is not None, output=output, shape=spec.shape_key(),
                       x_shape=list(spec.x_shape), forced=spec.config.provider, route_by_batch=by_batch,
                       route=route, note=WEIGHT_ONLY_NOTE if route is None else None,
                       weight_rounding=None if spec.rounding is None else _rounding(spec.rounding),
                       per_token=None if spec.per_token is None else dict(spec.per_token))


def table_record(kind: str, module: str, shape: dict, ecfg: EmbeddingConfig, route: Route,
                 bag_mode: str | None) -> LayerRecord:
    """An embedding table ("embedding" or "embedding_bag"), weight-only and rowwise."""
    return LayerRecord(kind=kind, mode="weight_only", module=module, shape=dict(shape), forced=ecfg.provider,
                       route=route, embedding=EmbeddingInfo(ecfg.bits, _dtype_name(ecfg.qparams_dtype), bag_mode))


def lstm_record(module: str, providers: dict, x_shape, forced: str | None, by_batch: bool) -> LayerRecord:
    """A dynamic LSTM: one provider per product kind (input projection "ih", recurrent "hh")."""
    note = lstm_note(providers)
    return LayerRecord(kind="lstm", mode="dynamic", module=module, x_shape=list(x_shape) if x_shape else None,
                       forced=forced, route_by_batch=by_batch, note=note)


def activation_record(observer: Observer, qp: QParams, chosen: tuple | None = None) -> ActivationRecord:
    """The observed value's chosen float range (`chosen`, where the caller has it) and the settings its
    qparams were computed with."""
    lo, hi = observer.chosen_range() if chosen is None else chosen
    return ActivationRecord(range=[float(lo), float(hi)], dtype=_dtype_name(qp.dtype), symmetric=observer.symmetric,
                            qmin=qp.qmin, qmax=qp.qmax, eps=observer.eps)


def _rounding(info: dict) -> dict:
    """A layer's weight-rounding report: the method, and GPTQ's proxy output error against nearest
    rounding's in dB (how much less output error its rounding makes on the calibration data)."""
    rec = {"method": info["method"]}
    before, after = info.get("proxy_error_nearest"), info.get("proxy_error")
    if before and after and before > 0 and after > 0:
        rec["gain_db"] = round(10 * math.log10(before / after), 2)
    if "why" in info:
        rec["why"] = info["why"]
    if info.get("bias_corrected"):
        rec["bias_corrected"] = True
    return rec
