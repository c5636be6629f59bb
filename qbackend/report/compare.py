"""`qbackend.compare(fp32_model, qmodel, data, metric=None)`: how much accuracy INT8 costs, and where.

One pass over the data, with hooks, not one model run per layer. For each batch:

* the FP32 model is run eagerly (the reference for the final output and the metric), and its
  captured graph (the same capture and BatchNorm folding the lowering used) through an
  fx.Interpreter that records the value at the place of each quantized layer (after its fused
  residual add and activation);
* the quantized model is run with forward hooks on its layers.

Per layer: `sqnr_db`, the layer's INT8 output against the FP32 model's value at the same place
(the error accumulated up to there), and `local_sqnr_db`, the layer alone: the FP32 model's input
at that place quantized with the layer's qparams and run through the INT8 layer, against the FP32
model's value (the error this layer adds, input quantization included; what `ranked()` sorts by,
most sensitive first). For the final output (every float tensor of the output structure): SQNR,
max abs error, cosine similarity, and the count of non-finite values (NaN, inf) in each model's
output: where there is any, SQNR and cosine are NaN and the max abs error NaN or inf (never a
number computed from the finite values only), and a note says so. With `metric` (a function model -> float, higher is better), both
models' values and the drop. Models converted through the module-swap fallback are compared per
module (hooks on the FP32 model's modules of the same names).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import torch
from torch import fx, nn
from torch.fx._pytree import tree_flatten_spec
from torch.utils import _pytree as pytree

from ..config import QuantConfig
from ..core.batches import batches as iter_batches
from ..lowering.capture import capture
from ..lowering.fold import fold_batchnorm
from ..lowering.nhwc_flatten import nhwc_features
from ..lowering.patterns import match
from ..nn import QuantizedConv2d, QuantizedLinear, WeightOnlyConv2d, WeightOnlyLinear
from ..nn.model import QuantizedModel


@dataclass
class LayerReport:
    """One layer's accuracy: SQNR against FP32 at its place, and its own SQNR on FP32 inputs."""

    name: str
    kind: str
    provider: str
    sqnr_db: float | None
    local_sqnr_db: float | None


@dataclass
class OutputReport:
    """The output's accuracy against FP32: SQNR, max absolute error, cosine, and the number of
    non-finite values in the FP32 and in the INT8 output (the metrics are NaN / inf where either
    is non-zero)."""

    sqnr_db: float
    max_abs_error: float
    cosine: float
    nonfinite_fp32: int = 0
    nonfinite_int8: int = 0


@dataclass
class CompareResult:
    """What compare returns: the per-layer and output reports, the metric on both models, notes."""

    layers: list[LayerReport]
    output: OutputReport
    metric: dict | None = None
    batches: int = 0
    notes: list[str] = field(default_factory=list)

    def ranked(self) -> list[LayerReport]:
        """Layers from most to least sensitive (lowest local SQNR first; unknown last)."""
        return sorted(self.layers, key=lambda r: (r.local_sqnr_db is None, r.local_sqnr_db or 0.0))

    def to_dict(self) -> dict:
        return {"output": asdict(self.output), "metric": self.metric, "batches": self.batches,
                "layers": [asdict(r) for r in self.layers], "ranked": [r.name for r in self.ranked()],
                "notes": list(self.notes)}

    def to_json(self, indent: int = 2) -> str:
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v
        return json.dumps(pytree.tree_map(clean, self.to_dict()), indent=indent)

    def to_markdown(self, top: int | None = None) -> str:
        o = self.output
        lines = [f"Output over {self.batches} batches: SQNR {o.sqnr_db:.2f} dB, max abs error {o.max_abs_error:.4g}, "
                 f"cosine {o.cosine:.6f}"]
        if o.nonfinite_fp32 or o.nonfinite_int8:
            lines[0] += f" (non-finite values: FP32 {o.nonfinite_fp32}, INT8 {o.nonfinite_int8})"
        if self.metric:
            m = self.metric
            lines.append(f"Metric: FP32 {m['fp32']:.4f}, INT8 {m['int8']:.4f} (drop {m['drop']:.4f})")
        lines += ["", "| layer | op | provider | SQNR vs FP32 (dB) | layer's own SQNR (dB) | rank |",
                  "|---|---|---|---|---|---|"]
        rank = {r.name: i + 1 for i, r in enumerate(self.ranked())}
        rows = self.layers if top is None else sorted(self.layers, key=lambda r: rank[r.name])[:top]
        for r in rows:
            lines.append(f"| {r.name} | {r.kind} | {r.provider} | {_fmt(r.sqnr_db)} | {_fmt(r.local_sqnr_db)} | "
                         f"{rank[r.name]} |")
        return "\n".join(lines + [f"\n_{n}_" for n in self.notes])


def _fmt(v) -> str:
    return "-" if v is None else ("inf" if v == math.inf else f"{v:.2f}")


class _Acc:
    """Running sums of reference energy and error energy (float64)."""

    def __init__(self):
        self.ref = self.err = 0.0
        self.n = 0

    def add(self, ref: torch.Tensor, out: torch.Tensor) -> None:
        r, o = ref.detach().double(), out.detach().double()
        if r.shape != o.shape:
            raise ValueError(f"shape mismatch {tuple(r.shape)} vs {tuple(o.shape)}")
        self.ref += float(r.pow(2).sum())
        self.err += float((r - o).pow(2).sum())
        self.n += 1

    def sqnr(self) -> float | None:
        if self.n == 0:
            return None
        if not (math.isfinite(self.ref) and math.isfinite(self.err)):
            return math.nan  # a NaN or inf in either side: no SQNR
        if self.err == 0.0:
            return math.inf
        return 10 * math.log10(max(self.ref, 1e-300) / self.err)


def _float_leaves(out) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _layer_output_float(m, out: torch.Tensor) -> torch.Tensor:
    if isinstance(out, tuple):  # the LSTM
        out = out[0]
    if isinstance(m, (QuantizedLinear, QuantizedConv2d)) and m.out_dtype != torch.float32:
        return (out.double() - m.out_zero_point).float() * m.out_scale
    return out


class _GraphSide:
    """The FP32 captured graph, recording at each quantized layer's place its output value and its
    input (and residual) values."""

    def __init__(self, fp32_model: nn.Module, qmodel: QuantizedModel, args, kwargs):

        self.gm = capture(fp32_model, args, kwargs)
        fold_batchnorm(self.gm)
        ops, _ = match(self.gm, fp32_model, QuantConfig())
        by_name = {op.name: op for op in ops}
        self.wanted: dict[fx.Node, list[tuple[str, str]]] = {}
        for name, info in qmodel.qbackend_layers.items():
            op = by_name.get(name)
            if op is None:
                continue
            node = op.anchor
            if info.residual:
                node = next(iter(node.users))
            if info.post_op != "none":
                node = next(iter(node.users))
            for n, role in ((node, "out"), (op.x, "x"), (op.accum if info.residual else None, "accum")):
                if n is not None:
                    self.wanted.setdefault(n, []).append((name, role))

    def run(self, args, kwargs) -> dict[str, dict]:
        values: dict[str, dict] = {}
        wanted = self.wanted

        class Recorder(fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                for name, role in wanted.get(n, ()):
                    values.setdefault(name, {})[role] = out.detach()
                return out

        flat = tree_flatten_spec((list(args), kwargs), self.gm._in_spec)
        with torch.no_grad():
            Recorder(self.gm).run(*flat)
        return values


def _quantized(t: torch.Tensor, scale: float, zp: int, dtype: torch.dtype, qmax: int | None) -> torch.Tensor:
    q = torch.ops.qbackend.quantize_per_tensor(t, scale, zp, dtype)
    return torch.clamp_max(q, qmax) if qmax is not None else q


def _alone(m, rec: dict, activations: dict) -> torch.Tensor | None:
    """The layer run by itself on the FP32 model's input at its place (quantized with its qparams)."""
    x = rec.get("x")
    if x is None:
        return None
    if isinstance(m, (QuantizedLinear, QuantizedConv2d)):
        if getattr(m, "x_nhwc", None) is not None:  # it reads its input's features in NHWC order
            x = nhwc_features(x, *m.x_nhwc)

        def q(t, scale, zp, dtype, value):
            qmax = activations[value].qmax if value in activations else None
            top = 255 if dtype == torch.uint8 else 127
            return _quantized(t, scale, zp, dtype, qmax if qmax is not None and qmax < top else None)
        args = [q(x, m.x_scale, m.x_zero_point, m.x_dtype, m.x_value)]
        if getattr(m, "has_accum", False):
            if rec.get("accum") is None:
                return None
            args.append(q(rec["accum"], m.accum_scale, m.accum_zero_point, m.accum_dtype, m.accum_value))
        return _layer_output_float(m, m.forward(*args))
    return _layer_output_float(m, m.forward(x))


def compare(fp32_model: nn.Module, qmodel: QuantizedModel, data: Iterable, metric: Callable | None = None,
            progress: bool = False) -> CompareResult:
    if not isinstance(qmodel, QuantizedModel):
        raise TypeError(f"compare takes the model qbackend.convert / quantize returned, got {type(qmodel).__name__}")
    if not isinstance(fp32_model, nn.Module):
        raise TypeError(f"fp32_model must be an nn.Module, got {type(fp32_model).__name__}")
    if metric is not None and not callable(metric):
        raise TypeError("metric must be a function model -> float")
    batches = list(iter_batches(data, "data batches"))
    if not batches:
        raise ValueError("compare needs at least one batch of data")
    first = batches[0]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="compare", unit="batch")
    graph_side = None
    notes = []
    if qmodel.graph_module is not None:
        try:
            graph_side = _GraphSide(fp32_model, qmodel, *first)
        except Exception as exc:  # noqa: BLE001  (per-layer SQNR is then unavailable, the output still is)
            notes.append(f"per-layer SQNR unavailable: the FP32 model could not be captured ({exc})")
    acc = {name: (_Acc(), _Acc()) for name in qmodel.qbackend_layers}
    out_acc, max_err, dot, n_ref, n_out = _Acc(), 0.0, 0.0, 0.0, 0.0
    bad_ref = bad_out = 0  # non-finite values in each model's output
    fp32_values: dict[str, torch.Tensor] = {}
    handles = []

    def hook(name):
        def fn(m, inputs, out):
            rec = fp32_values.pop(name, None)
            if rec is None or rec.get("out") is None:
                return
            acc[name][0].add(rec["out"], _layer_output_float(m, out))
            alone = _alone(m, rec, qmodel.qbackend_activations)
            if alone is not None:
                acc[name][1].add(rec["out"], alone)
        return fn

    for name in qmodel.qbackend_layers:
        handles.append(qmodel.layer(name).register_forward_hook(hook(name)))
    fp32_hooks = []
    if graph_side is None:  # module swap: the FP32 module of the same name gives the reference
        for name in qmodel.qbackend_layers:
            try:
                mod = fp32_model.get_submodule(name)
            except AttributeError:
                continue
            fp32_hooks.append(mod.register_forward_hook(
                lambda m, i, o, name=name: fp32_values.__setitem__(
                    name, {"out": (o[0] if isinstance(o, tuple) else o).detach(),
                           "x": i[0].detach() if isinstance(m, (nn.Linear, nn.Conv2d)) else None})))
    try:
        n = 0
        with torch.no_grad():
            for args, kwargs in batches:
                ref_out = fp32_model(*args, **kwargs)
                if graph_side is not None:
                    fp32_values.update(graph_side.run(args, kwargs))
                q_out = qmodel(*args, **kwargs)
                fp32_values.clear()
                r = torch.cat([t.reshape(-1).double() for t in _float_leaves(ref_out)])
                o = torch.cat([t.reshape(-1).double() for t in _float_leaves(q_out)])
                out_acc.add(r, o)
                bad_ref += int((~torch.isfinite(r)).sum())
                bad_out += int((~torch.isfinite(o)).sum())
                batch_err = float((r - o).abs().max()) if r.numel() else 0.0  # torch's max keeps NaN
                max_err = math.nan if math.isnan(batch_err) or math.isnan(max_err) else max(max_err, batch_err)
                dot += float((r * o).sum())
                n_ref += float(r.pow(2).sum())
                n_out += float(o.pow(2).sum())
                n += 1
    finally:
        for h in handles + fp32_hooks:
            h.remove()
    layers = []
    for name, info in qmodel.qbackend_layers.items():
        m = qmodel.layer(name)
        provider = getattr(getattr(m, "packed", None), "provider_name", None) or (
            "fp32 compute" if isinstance(m, (WeightOnlyLinear, WeightOnlyConv2d)) else "mixed")
        layers.append(LayerReport(name, info.kind, provider, acc[name][0].sqnr(), acc[name][1].sqnr()))
    cosine = dot / math.sqrt(max(n_ref * n_out, 1e-300))
    if bad_ref or bad_out:
        cosine = math.nan
        if math.isfinite(max_err):  # inf against inf at the same place: no error there, but no number either
            max_err = math.nan
        notes.append(f"the outputs hold non-finite values ({bad_ref} non-finite values in the FP32 output, "
                     f"{bad_out} in the INT8 output): SQNR and cosine are NaN, max abs error {max_err}")
    result = CompareResult(layers, OutputReport(out_acc.sqnr() or 0.0, max_err, cosine, bad_ref, bad_out),
                           batches=n, notes=notes)
    if metric is not None:
        f, q = float(metric(fp32_model)), float(metric(qmodel))
        result.metric = {"fp32": f, "int8": q, "drop": f - q}
    return result

