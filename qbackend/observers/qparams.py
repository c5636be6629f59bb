"""Quantization parameters: the `QParams` record every observer returns, and `choose_qparams`, the
one rule that turns a float range into a scale and a zero point.

The rule (float64 arithmetic, then the scale rounded to float32, the precision the kernels use):

* The range is widened to include 0: lo = min(min, 0), hi = max(max, 0), so that 0 (padding, ReLU
  zeros) is exactly representable.
* Asymmetric:  scale = (hi - lo) / (qmax - qmin),  zero_point = clamp(qmin - round(lo / scale)),
  rounding half to even.
* Symmetric:   scale = max(-lo, hi) / ((qmax - qmin) / 2),  zero_point = (qmin + qmax + 1) // 2,
  i.e. 0 for int8 [-128, 127], 128 for uint8 [0, 255] (64 for the 7-bit [0, 127]). The largest
  magnitude then lands on a level or half a step beyond the last one, never further: no more
  error than rounding anywhere else.
* eps guard: a scale below `eps` (default float32 epsilon, as torch.ao) is raised to `eps`.
* Degenerate range: when lo == hi (only possible as min == max == 0: all-zero data), the scale is
  1.0 (any scale represents 0 exactly; 1.0 is the neutral choice) and the zero point the one above
  (qmin for asymmetric, which maps 0 to qmin).

`reduce_range` is the 7-bit uint8 range [0, 127]: without VNNI, FBGEMM and oneDNN multiply u8 x s8
with 16-bit saturation (csrc/common/saturation.h), so activations for them must stay below 128.
The default for uint8 activations is 7-bit only where no provider multiplies 8-bit ones exactly
(`default_reduce_range`: ops.providers.exact_8bit_activations; the native GEMM does on every AVX2
CPU). It does not apply to int8.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ops.providers import exact_8bit_activations

__all__ = ["QParams", "choose_qparams", "default_reduce_range", "qrange", "F32_EPS"]

F32_EPS = float(torch.finfo(torch.float32).eps)
_F32_TINY = float(torch.finfo(torch.float32).tiny)
_DTYPE_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


def _dtype_name(dtype) -> str:
    return str(dtype) if isinstance(dtype, torch.dtype) else repr(dtype)


def check_qdtype(dtype, what: str = "dtype") -> torch.dtype:
    """dtype must be torch.uint8 or torch.int8 (plain integer dtypes, not torch.quint8/qint8)."""
    if dtype not in _DTYPE_RANGE:
        raise TypeError(f"{what} must be torch.uint8 or torch.int8, got {_dtype_name(dtype)}")
    return dtype


def default_reduce_range(dtype: torch.dtype) -> bool:
    """7-bit activations where no provider multiplies 8-bit ones exactly on this CPU (or under
    QBACKEND_ISA): CPUs without AVX2; never for int8."""
    if dtype != torch.uint8:
        return False
    return not exact_8bit_activations()


def qrange(dtype: torch.dtype, reduce_range: bool | None = None, qmin: int | None = None,
           qmax: int | None = None) -> tuple[int, int]:
    """The integer range [qmin, qmax] for dtype, reduce_range (None: the machine default, unless
    explicit bounds are given) and any explicit bounds (in the dtype's range, qmin < qmax)."""
    check_qdtype(dtype)
    lo, hi = _DTYPE_RANGE[dtype]
    if reduce_range is None:  # explicit bounds win over the machine default
        reduce_range = default_reduce_range(dtype) if qmin is None and qmax is None else False
    if not isinstance(reduce_range, bool):
        raise TypeError(f"reduce_range must be True, False or None, got {reduce_range!r}")
    if reduce_range:
        if dtype != torch.uint8:
            raise ValueError("reduce_range applies to uint8 activations (the 7-bit range [0, 127]), not to "
                             f"{_dtype_name(dtype)}")
        if qmax is not None:
            raise ValueError("give either reduce_range=True or an explicit qmax, not both")
        hi = 127
    for name, v in (("qmin", qmin), ("qmax", qmax)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError(f"{name} must be an int or None, got {type(v).__name__}")
    qmin = lo if qmin is None else qmin
    qmax = hi if qmax is None else qmax
    if not (lo <= qmin < qmax <= _DTYPE_RANGE[dtype][1]):
        raise ValueError(f"need {lo} <= qmin < qmax <= {_DTYPE_RANGE[dtype][1]} for {_dtype_name(dtype)}, "
                         f"got qmin={qmin}, qmax={qmax}")
    return qmin, qmax


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


@dataclass(frozen=True, eq=False)
class QParams:
    """Quantization parameters: q = clamp(round(x / scale) + zero_point, qmin, qmax).

    Per-tensor: `scale` a float (a float32 value) and `zero_point` an int, `axis` None.
    Per-channel: `scale` a 1-D float32 tensor and `zero_point` a 1-D int32 tensor along `axis`.
    """

    scale: float | torch.Tensor
    zero_point: int | torch.Tensor
    dtype: torch.dtype
    qmin: int
    qmax: int
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, QParams):
            return NotImplemented
        if (self.dtype, self.qmin, self.qmax, self.axis) != (other.dtype, other.qmin, other.qmax, other.axis):
            return False
        if self.per_channel:
            return torch.equal(self.scale, other.scale) and torch.equal(self.zero_point, other.zero_point)
        return self.scale == other.scale and self.zero_point == other.zero_point

    __hash__ = None  # type: ignore[assignment]  (tensor fields)


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps >= _F32_TINY):
        raise ValueError(f"eps must be a finite float >= {_F32_TINY:g} (float32's smallest normal), got {eps!r}")
    return _f32(float(eps))


def choose_qparams(min_val, max_val, dtype: torch.dtype = torch.uint8, symmetric: bool = False,
                   qmin: int | None = None, qmax: int | None = None, *, reduce_range: bool | None = False,
                   eps: float = F32_EPS, axis: int | None = None) -> QParams:
    """Scale and zero point for the float range [min_val, max_val] (see the module docstring).

    min_val/max_val: floats (per-tensor) or 1-D tensors of one length (per-channel, with `axis`).
    They must be finite with min_val <= max_val. reduce_range defaults to False here (the observers
    default it to the machine's need); None means the machine default.
    """
    qmin, qmax = qrange(dtype, reduce_range, qmin, qmax)
    eps = _check_eps(eps)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
    if isinstance(min_val, torch.Tensor) or isinstance(max_val, torch.Tensor):
        return _choose_per_channel(min_val, max_val, dtype, symmetric, qmin, qmax, eps, axis)
    if axis is not None:
        raise ValueError("axis is only meaningful with per-channel (1-D tensor) min_val/max_val")
    lo, hi = float(min_val), float(max_val)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"min_val and max_val must be finite, got [{lo}, {hi}]")
    if lo > hi:
        raise ValueError(f"min_val must be <= max_val, got [{lo}, {hi}]")
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        zp = (qmin + qmax + 1) // 2
        amax = max(-lo, hi)
        scale = 1.0 if amax == 0.0 else max(_f32(amax / ((qmax - qmin) / 2)), eps)
        _check_finite_scale(scale, lo, hi)
        return QParams(scale, zp, dtype, qmin, qmax)
    if lo == hi:
        return QParams(1.0, qmin, dtype, qmin, qmax)
    scale = max(_f32((hi - lo) / (qmax - qmin)), eps)
    _check_finite_scale(scale, lo, hi)
    zp = int(min(max(qmin - round(lo / scale), qmin), qmax))
    return QParams(scale, zp, dtype, qmin, qmax)


def _check_finite_scale(scale, lo, hi) -> None:
    if not math.isfinite(scale):
        raise ValueError(f"the range [{lo}, {hi}] is too wide for a float32 scale")


def _choose_per_channel(min_val, max_val, dtype, symmetric, qmin, qmax, eps, axis) -> QParams:
    if not (isinstance(min_val, torch.Tensor) and isinstance(max_val, torch.Tensor)):
        raise TypeError("per-channel min_val and max_val must both be tensors")
    if min_val.dim() != 1 or min_val.shape != max_val.shape:
        raise ValueError(f"per-channel min_val and max_val must be 1-D of one length, got shapes "
                         f"{tuple(min_val.shape)} and {tuple(max_val.shape)}")
    if axis is None or isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"per-channel qparams need an int axis, got {axis!r}")
    lo, hi = min_val.double(), max_val.double()
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        raise ValueError("min_val and max_val must be finite")
    if (lo > hi).any():
        raise ValueError("min_val must be <= max_val in every channel")
    lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
    if symmetric:
        amax = torch.maximum(-lo, hi)
        scale = (amax / ((qmax - qmin) / 2)).float().clamp(min=eps)
        scale = torch.where(amax == 0.0, torch.ones_like(scale), scale)
        if not torch.isfinite(scale).all():
            raise ValueError("a channel's range is too wide for a float32 scale")
        zp = torch.full(scale.shape, (qmin + qmax + 1) // 2, dtype=torch.int32)
        return QParams(scale, zp, dtype, qmin, qmax, axis)
    degenerate = lo == hi
    scale = ((hi - lo) / (qmax - qmin)).float().clamp(min=eps)
    scale = torch.where(degenerate, torch.ones_like(scale), scale)
    if not torch.isfinite(scale).all():
        raise ValueError("a channel's range is too wide for a float32 scale")
    zp = (qmin - torch.round(lo / scale.double())).clamp(qmin, qmax).to(torch.int32)
    return QParams(scale, zp, dtype, qmin, qmax, axis)
