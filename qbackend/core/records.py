"""The typed records a converted model carries: one `LayerRecord` per quantized layer (what it is,
its example shapes, fusion, where it runs and why) and one `ActivationRecord` per int8 activation
value (the float range and settings its qparams came from, so they can be recomputed for another
CPU). Built by qbackend.lowering.records, read by explain, compare, rebind, the demo and the CLI.

Saved files hold them as plain dicts (`to_dict`, with RECORD_VERSION under "version"), so a file
does not depend on the classes' layout; `from_dict` also reads the untyped dicts of the first
format (no "version" key), which files saved before the records existed carry.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from .routes import RULE, BatchRoutes, Route
from .state_version import check_state_version

RECORD_VERSION = 2
WEIGHT_ONLY_NOTE = "weight-only (FP32 compute)"


def lstm_note(providers: dict) -> str:
    """The why of a dynamic LSTM's record: its providers by product kind ({"ih": [...], "hh": [...]})."""
    return "dynamic LSTM (providers: " + ", ".join(f"{k} {v}" for k, v in providers.items()) + ")"


@dataclass
class EmbeddingInfo:
    """How a table is stored: bits per value, the per-row scale/bias dtype, the bag mode (None for
    plain lookups)."""

    bits: int
    qparams: str
    mode: str | None = None


@dataclass
class LayerRecord:
    """One quantized layer of a converted model.

    kind: "linear", "conv2d", "embedding", "embedding_bag" or "lstm"; mode: "static", "dynamic"
    or "weight_only"; module: the layer's module path in the converted model; post_op and
    residual: what is fused into it; output: "int8" or "float32"; shape: the rules' shape keys at
    the example input (qbackend.dispatch.rules); x_shape: the example input's shape; forced: the
    provider the config forced; route_by_batch: routed per call size; route: where it runs (None
    when it computes in float or holds several products, the LSTM: `note` says so);
    rerouted_from: the provider it had where it was saved, when loading moved it;
    weight_rounding: GPTQ's report; embedding: a table's storage; per_token: a static Linear that
    reads its input as float and quantizes it per token at run time: {"qmax": its levels' top,
    "gain_db": the static range's calibration output error over the per-token one}."""

    kind: str
    mode: str
    module: str
    post_op: str = "none"
    residual: bool = False
    output: str = "float32"
    shape: dict = field(default_factory=dict)
    x_shape: list | None = None
    forced: str | None = None
    route_by_batch: bool = False
    route: Route | None = None
    note: str | None = None
    rerouted_from: str | None = None
    weight_rounding: dict | None = None
    embedding: EmbeddingInfo | None = None
    per_token: dict | None = None

    @property
    def why(self) -> str:
        """Where it runs and why, one line."""
        text = self.route.describe() if self.route is not None else (self.note or "")
        return text if self.rerouted_from is None else f"re-routed on this machine ({self.rerouted_from} before): {text}"

    @property
    def rule(self) -> str | None:
        """The condition of the rule row that routed it (None unless the rules did)."""
        return self.route.rule if self.route is not None and self.route.source == RULE else None

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["shape"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.shape.items()}
        out["route"] = None if self.route is None else _route_dict(self.route)
        out["embedding"] = None if self.embedding is None else asdict(self.embedding)
        return {"version": RECORD_VERSION, **out}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerRecord":
        if not isinstance(d, dict):
            raise TypeError(f"a layer record must be a dict, got {type(d).__name__}")
        if "version" not in d:
            return _layer_v1(d)
        check_state_version(d["version"], (RECORD_VERSION,), "a layer record", "version")
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["shape"] = _shape(kw.get("shape") or {})
        kw["route"] = None if kw.get("route") is None else _route(kw["route"])
        kw["embedding"] = None if kw.get("embedding") is None else EmbeddingInfo(**kw["embedding"])
        return cls(**kw)


@dataclass
class ActivationRecord:
    """One int8 activation value: the float range its observer chose, and the settings its qparams
    were computed with (dtype "uint8" / "int8", symmetric, qmin, qmax, eps); smoothquant: what the
    SmoothQuant search found for it, where it was a candidate."""

    range: list
    dtype: str
    symmetric: bool
    qmin: int
    qmax: int
    eps: float
    smoothquant: dict | None = None

    def to_dict(self) -> dict:
        return {"version": RECORD_VERSION, **asdict(self), "range": [float(v) for v in self.range]}

    @classmethod
    def from_dict(cls, d: dict) -> "ActivationRecord":
        if not isinstance(d, dict):
            raise TypeError(f"an activation record must be a dict, got {type(d).__name__}")
        check_state_version(d.get("version", 1), (1, RECORD_VERSION), "an activation record", "version")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _shape(shape: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in shape.items()}


def _route_dict(r: Route) -> dict:
    return {"provider": r.provider, "source": r.source, "why": r.why, "rule": r.rule,
            "batch_routes": None if r.batch_routes is None else [r.batch_routes.key, r.batch_routes.to_list()]}


def _route(d: dict) -> Route:
    routes = d.get("batch_routes")
    return Route(d["provider"], d["source"], d["why"], d.get("rule"),
                 None if routes is None else BatchRoutes.from_list(*routes))


def _layer_v1(d: dict) -> LayerRecord:
    """A record of the first format: a dict whose "why" is the text of its route. The route itself
    was not recorded: loading routes the layer again (rebind), which sets it."""
    emb = d.get("embedding")
    return LayerRecord(kind=d["kind"], mode=d["mode"], module=d["module"], post_op=d.get("post_op", "none"),
                       residual=bool(d.get("residual", False)), output=d.get("output", "float32"),
                       shape=_shape(d.get("shape") or {}), x_shape=d.get("x_shape"), forced=d.get("forced"),
                       route_by_batch=bool(d.get("route_by_batch", False)), note=d.get("why"),
                       weight_rounding=d.get("weight_rounding"), embedding=EmbeddingInfo(**emb) if emb else None)
