"""`qbackend.explain(qmodel)`: per quantized layer, what it is, what it runs on, and why.

Returns an `Explanation` (a list of rows, one per layer, in graph order) with `.to_markdown()`;
`qbackend explain FILE` prints it for a model saved with `qbackend.save`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.records import LayerRecord
from ..nn.model import QuantizedModel


def _provider(module) -> str:
    packed = getattr(module, "packed", None)
    if packed is not None:
        return packed.provider_name
    label = getattr(module, "provider_label", None)  # the LSTM: one provider per packed weight
    if label:
        return label
    return "fp32 compute"


def _shape(info: LayerRecord) -> str:
    s = info.shape
    if info.kind == "linear" and s:
        return f"M={s['m']} K={s['k']} N={s['n']}"
    if info.kind == "conv2d" and s:
        k = "x".join(map(str, s["kernel"]))
        st = s["stride"][0] if isinstance(s["stride"], (list, tuple)) else s["stride"]
        g = f" g={s['groups']}" if s["groups"] > 1 else ""
        return f"{s['n']}x{s['c_in']}x{s['h']}x{s['w']} -> {s['c_out']} {k}/s{st}{g}"
    if info.kind in ("embedding", "embedding_bag") and s:
        e = info.embedding
        mode = f" {e.mode}" if e is not None and e.mode else ""
        qparams = e.qparams if e is not None else "float16"
        return f"{s['rows']}x{s['dim']} table, {s['bits']}-bit rowwise ({qparams} scale/bias){mode}"
    return "x " + "x".join(map(str, info.x_shape)) if info.x_shape else "-"


@dataclass
class Explanation:
    """One row per quantized layer, in graph order: layer, op, mode, shape (at the example), fused,
    output, provider, why (one line) and rule (the condition of the rule row that routed it, or
    None)."""

    rows: list[dict]
    eager: list[str] = None  # how eager calls run (QuantizedModel.forward_plan_summary)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_markdown(self) -> str:
        head = "| layer | op | mode | shape (example) | fused | output | provider | why |\n|---|---|---|---|---|---|---|---|"
        lines = [f"| {r['layer']} | {r['op']} | {r['mode']} | {r['shape']} | {r['fused']} | {r['output']} | "
                 f"{r['provider']} | {r['why']} |" for r in self.rows]
        eager = [f"- {line}" for line in self.eager or ()]
        return "\n".join([head, *lines, *(["", "Eager calls:", *eager] if eager else [])])


def explain(qmodel: QuantizedModel) -> Explanation:
    if not isinstance(qmodel, QuantizedModel):
        raise TypeError(f"explain takes a model from qbackend.convert / quantize / load, got {type(qmodel).__name__}")
    rows = []
    for name, info in qmodel.qbackend_layers.items():
        fused = [p for p in (("+residual" if info.residual else ""),
                             (info.post_op if info.post_op != "none" else "")) if p]
        mode = info.mode + (" (per-token input)" if info.per_token else "")
        rows.append({"layer": name, "op": info.kind, "mode": mode, "shape": _shape(info),
                     "fused": " ".join(fused) or "-", "output": info.output,
                     "provider": _provider(qmodel.layer(name)), "why": info.why, "rule": info.rule})
    return Explanation(rows, qmodel.forward_plan_summary())
