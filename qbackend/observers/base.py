"""The observer interface shared by every qbackend observer, and its policies.

An observer watches calibration data (`update(x)`, which returns x unchanged so it can sit in a
forward pass), keeps statistics that can be saved (`state_dict()` / `load_state_dict()`, tensors
and plain Python values only, so `torch.save` / `torch.load(weights_only=True)` round-trip them)
and merged (`merge(other)`: statistics of calibration split over batches or processes, merged, give
the qparams of one pass over all the data), and turns them into quantization parameters
(`compute_qparams()`, see qbackend.observers.qparams for the rule).

Policies, the same for every observer:

* Non-finite calibration values (NaN, +inf, -inf) are never part of a range. With
  ``nonfinite="skip"`` (the default) they are skipped and counted (`nonfinite_count`, kept in the
  state and summed by merge); the first time an observer meets some it warns once
  (`NonFiniteWarning`, naming the observer and giving the count so far), later ones are counted
  silently. With ``nonfinite="raise"`` an update that contains any raises `ObserverError` (a
  ValueError) naming the observer and the count, and leaves the observer unchanged.
* An empty tensor is a no-op (its dtype is still checked).
* Inputs: CPU float32, bfloat16 or float16 tensors (float16 is widened to float32, exactly); any
  shape and strides. Anything else raises TypeError naming the observer.
* `compute_qparams()` on an observer that saw no finite value raises `ObserverError` naming it
  (`name`, which the lowering sets to the layer's name), so converting such a layer fails with
  the layer in the message.
* `merge` requires the same observer class and the same configuration (`config()`: dtype, qmin,
  qmax, symmetric, eps and the class's own settings), else TypeError / ValueError; `name` and the
  non-finite policy are not statistics and are not compared (or saved).
"""
from __future__ import annotations

import abc
import math
import warnings
from typing import Any, ClassVar

import torch

from ..core.state_version import check_state_version
from ..ops import observer_ops  # noqa: F401  (registers the observer ops' fake impls)
from .qparams import F32_EPS, QParams, _check_eps, check_qdtype, choose_qparams, qrange

__all__ = ["Observer", "ObserverError", "NonFiniteWarning", "NONFINITE_POLICIES"]

NONFINITE_POLICIES = ("skip", "raise")
STATE_VERSION = 1
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_QDTYPE_NAMES = {torch.uint8: "uint8", torch.int8: "int8"}
_QDTYPES_BY_NAME = {v: k for k, v in _QDTYPE_NAMES.items()}


class ObserverError(ValueError):
    """An observer cannot give qparams (no data) or refused its data (nonfinite='raise')."""


class NonFiniteWarning(UserWarning):
    """Calibration data had NaN/inf values, which the observer skipped."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ops():
    """torch.ops.qbackend, whose observer ops' fake impls qbackend.ops.observer_ops registers."""
    return torch.ops.qbackend


# kind -> observer class: every concrete subclass registers itself (Observer.__init_subclass__).
OBSERVER_CLASSES: dict[str, type] = {}


class Observer(abc.ABC):
    """Base class: the configuration, the policies above and the state_dict / merge plumbing.

    Subclasses implement `_reset_stats`, `_observe`, `_stats`, `_load_stats`, `_merge_stats` and
    `_range`, and list their own settings in `_extra_config`.
    """

    kind: ClassVar[str] = "Observer"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            OBSERVER_CLASSES[cls.kind] = cls
    _per_channel: ClassVar[bool] = False

    def __init__(self, dtype: torch.dtype = torch.uint8, symmetric: bool = False, *, reduce_range: bool | None = None,
                 qmin: int | None = None, qmax: int | None = None, eps: float = F32_EPS, nonfinite: str = "skip",
                 name: str | None = None):
        self.dtype = check_qdtype(dtype)
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
        self.symmetric = symmetric
        self.qmin, self.qmax = qrange(dtype, reduce_range, qmin, qmax)
        self.eps = _check_eps(eps)
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}, got {nonfinite!r}")
        self.nonfinite = nonfinite
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        self.name = name
        self._warned = False
        self.reset()

    # ------------------------------------------------------------------ public interface

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """Fold x into the statistics; returns x itself."""
        t = self._input(x)
        if t.numel() > 0:
            self._observe(t)
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.update(x)

    @property
    def has_data(self) -> bool:
        """Whether the observer has seen at least one finite value."""
        return self.count > 0

    def chosen_range(self):
        """The float range (lo, hi) the qparams are computed from (before 0 is included)."""
        if not self.has_data:
            raise self._no_data_error()
        return self._range()

    def compute_qparams(self) -> QParams:
        return self.qparams_for_range(*self.chosen_range())

    def qparams_for_range(self, lo, hi) -> QParams:
        """The qparams of the float range (lo, hi) under this observer's settings: compute_qparams
        is qparams_for_range(*chosen_range()), for a caller that also reads the range."""
        return choose_qparams(lo, hi, self.dtype, self.symmetric, self.qmin, self.qmax, reduce_range=False,
                              eps=self.eps, axis=self.axis if self._per_channel else None)

    def config(self) -> dict[str, Any]:
        """The settings that shape the statistics and qparams (plain Python values)."""
        return {"dtype": _QDTYPE_NAMES[self.dtype], "symmetric": self.symmetric, "qmin": self.qmin,
                "qmax": self.qmax, "eps": self.eps, **self._extra_config()}

    def state_dict(self) -> dict[str, Any]:
        """{"kind", "version", "config", "stats"}: tensors (copies) and plain Python values."""
        stats = {"count": self.count, "nonfinite": self.nonfinite_count, **self._stats()}
        stats = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in stats.items()}
        return {"kind": self.kind, "version": STATE_VERSION, "config": self.config(), "stats": stats}

    def load_state_dict(self, state: dict[str, Any]) -> Observer:
        """Replace the statistics by those of a state_dict of the same kind and config; returns self.

        Everything is validated before anything changes (ValueError / TypeError otherwise).
        """
        stats = self._check_state(state)
        config = state["config"]
        if config != self.config():
            diff = sorted(k for k in set(config) | set(self.config()) if config.get(k) != self.config().get(k))
            raise ValueError(f"{self._label()}: state_dict config differs in {', '.join(diff)}: "
                             f"{ {k: config.get(k) for k in diff} } vs this observer's "
                             f"{ {k: self.config().get(k) for k in diff} }")
        self._apply_state(stats)
        return self

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], *, nonfinite: str = "skip", name: str | None = None) -> Observer:
        """A new observer of the state_dict's kind and config, holding its statistics.

        Called on Observer, it picks the class named by state["kind"]."""
        if not isinstance(state, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state).__name__}")
        target = cls
        if cls is Observer or cls.kind != state.get("kind"):
            target = OBSERVER_CLASSES.get(state.get("kind"))
            if target is None or (cls is not Observer and not issubclass(target, cls)):
                raise ValueError(f"state_dict kind {state.get('kind')!r} is not a {cls.kind} "
                                 f"(known kinds: {', '.join(sorted(OBSERVER_CLASSES))})")
        config = state.get("config")
        if not isinstance(config, dict):
            raise ValueError("state_dict has no config dict")
        kwargs = dict(config)
        if kwargs.get("dtype") not in _QDTYPES_BY_NAME:
            raise ValueError(f"state_dict config dtype must be 'uint8' or 'int8', got {kwargs.get('dtype')!r}")
        kwargs["dtype"] = _QDTYPES_BY_NAME[kwargs["dtype"]]
        try:
            obs = target(**kwargs, reduce_range=False, nonfinite=nonfinite, name=name)
        except TypeError as exc:
            raise ValueError(f"state_dict config does not fit {target.kind}: {exc}") from exc
        return obs.load_state_dict(state)

    def merge(self, other: Observer) -> Observer:
        """Fold another observer's statistics into this one (in place); returns self."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {type(other).__name__} into {self._label()}")
        if other.config() != self.config():
            raise ValueError(f"cannot merge observers with different configs: {self._label()} has {self.config()}, "
                             f"{other._label()} has {other.config()}")
        if other.has_data:
            if self.has_data:
                self._merge_stats(other)
            else:
                for k, v in other._stats().items():
                    setattr(self, k, v.clone() if isinstance(v, torch.Tensor) else v)
            self.count += other.count
        self.nonfinite_count += other.nonfinite_count
        return self

    def reset(self) -> None:
        """Forget all statistics: new statistics objects are assigned (`_reset_stats` never changes
        the old ones in place), so a shallow copy of an observer can be reset without touching it."""
        self.count = 0
        self.nonfinite_count = 0
        self._reset_stats()

    def __repr__(self) -> str:
        cfg = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{self.kind}({cfg}, name={self.name!r}, count={self.count}, nonfinite={self.nonfinite_count})"

    # ------------------------------------------------------------------ for subclasses

    @abc.abstractmethod
    def _reset_stats(self) -> None: ...

    @abc.abstractmethod
    def _observe(self, x: torch.Tensor) -> None:
        """Fold a non-empty float32/bfloat16 tensor in; call self._skip_nonfinite(n) before changing
        anything, and add the number of finite values to self.count."""

    @abc.abstractmethod
    def _stats(self) -> dict[str, Any]:
        """The class's own statistics, keyed by attribute name (the base adds count and nonfinite)."""

    @abc.abstractmethod
    def _load_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Validate the class's own statistics (count is valid already); return what to assign."""

    @abc.abstractmethod
    def _merge_stats(self, other: Observer) -> None:
        """Both have data: fold other's own statistics in (the base adds count and nonfinite)."""

    @abc.abstractmethod
    def _range(self):
        """(lo, hi) from the statistics; only called with data."""

    def _extra_config(self) -> dict[str, Any]:
        return {}

    def _label(self) -> str:
        return f"{self.kind} {self.name!r}" if self.name else f"{self.kind} (unnamed)"

    def _skip_nonfinite(self, n: int) -> None:
        """Apply the non-finite policy to n non-finite values of one update (before any change)."""
        if n == 0:
            return
        if self.nonfinite == "raise":
            raise ObserverError(f"{self._label()}: calibration data has {n} non-finite value(s) (NaN/inf) and "
                                "nonfinite='raise'; the observer is unchanged")
        self.nonfinite_count += n
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self._label()} skipped {n} non-finite value(s) (NaN/inf) in its calibration data "
                          f"({self.nonfinite_count} so far); further ones are counted without a warning "
                          "(.nonfinite_count) and never enter the range", NonFiniteWarning, stacklevel=4)

    def _no_data_error(self) -> ObserverError:
        extra = (f" (only {self.nonfinite_count} non-finite values, which were skipped)"
                 if self.nonfinite_count else "")
        return ObserverError(f"{self._label()} saw no calibration data{extra}: run calibration batches through "
                             "it before converting")

    def _input(self, x) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self._label()}: update() expects a torch.Tensor, got {type(x).__name__}")
        if x.layout != torch.strided:
            raise TypeError(f"{self._label()}: update() expects a dense (strided) tensor, got layout {x.layout}")
        if x.device.type != "cpu":
            raise ValueError(f"{self._label()}: update() expects a CPU tensor, got device {x.device}")
        if x.dtype not in _INPUT_DTYPES:
            raise TypeError(f"{self._label()}: update() expects a float32, bfloat16 or float16 tensor, got {x.dtype}")
        x = x.detach()
        return x.float() if x.dtype == torch.float16 else x

    # ------------------------------------------------------------------ state plumbing

    def _check_state(self, state) -> dict[str, Any]:
        if not isinstance(state, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state).__name__}")
        want = {"kind", "version", "config", "stats"}
        if set(state) != want:
            raise ValueError(f"state_dict keys must be {sorted(want)}; missing {sorted(want - set(state))}, "
                             f"unexpected {sorted(set(state) - want)}")
        if state["kind"] != self.kind:
            raise ValueError(f"state_dict is of a {state['kind']!r}, not of a {self.kind}")
        check_state_version(state["version"], (STATE_VERSION,), "state_dict", "version")
        if not isinstance(state["config"], dict) or not isinstance(state["stats"], dict):
            raise ValueError("state_dict config and stats must be dicts")
        stats = state["stats"]
        want_stats = {"count", "nonfinite", *self._stats()}
        if set(stats) != want_stats:
            raise ValueError(f"state_dict stats keys must be {sorted(want_stats)}; missing "
                             f"{sorted(want_stats - set(stats))}, unexpected {sorted(set(stats) - want_stats)}")
        for key in ("count", "nonfinite"):
            if not _is_int(stats[key]) or stats[key] < 0:
                raise ValueError(f"state_dict stats[{key!r}] must be an int >= 0, got {stats[key]!r}")
        own = self._load_stats(stats)
        return {**own, "count": stats["count"], "nonfinite": stats["nonfinite"]}

    def _apply_state(self, values: dict[str, Any]) -> None:
        self.count = values["count"]
        self.nonfinite_count = values["nonfinite"]
        for k, v in values.items():
            if k not in ("count", "nonfinite"):
                setattr(self, k, v.clone() if isinstance(v, torch.Tensor) else v)


# helpers for subclasses --------------------------------------------------------------------------

def check_float_or_none(stats: dict, key: str, has_data: bool) -> float | None:
    v = stats[key]
    if not has_data:
        if v is not None:
            raise ValueError(f"state_dict stats[{key!r}] must be None when count is 0, got {v!r}")
        return None
    if not isinstance(v, float) or not math.isfinite(v):
        raise ValueError(f"state_dict stats[{key!r}] must be a finite float, got {v!r}")
    return v


def check_min_max(stats: dict) -> tuple[float | None, float | None]:
    has = stats["count"] > 0
    lo, hi = check_float_or_none(stats, "min_val", has), check_float_or_none(stats, "max_val", has)
    if has and lo > hi:
        raise ValueError(f"state_dict stats min {lo} > max {hi}")
    return lo, hi
