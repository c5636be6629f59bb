"""Quantize/dequantize: fake (meta) impls of torch.ops.qbackend.{quantize,dequantize}_per_{tensor,channel}
and the friendly wrappers `quantize` / `dequantize`.

The C++ kernels (csrc/ops/quantize_ops.cpp) register the ops when the extension loads; the fake
impls here let torch.compile / torch.export trace them. Semantics are those of
qbackend.ops.reference (fp32 division, round half to even, saturate; NaN -> zero point,
+-inf -> qmax/qmin). Outputs are contiguous with the input's shape; strided inputs are accepted.
"""
from __future__ import annotations

import numbers

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)

__all__ = ["quantize", "dequantize"]


def _check_channel_args(x, name, scales, zero_points, axis):
    """Shape/device checks of the per-channel ops, for tracing (the C++ op checks values too).

    The device check also matters eagerly: a meta `scales` with a CPU `x` dispatches here.
    """
    for arg, t in (("scales", scales), ("zero_points", zero_points)):
        torch._check_value(t.device == x.device, lambda: f"{arg} must be on {name}'s device {x.device}, got {t.device}")
    torch._check_value(x.dim() >= 1 and -x.dim() <= axis < x.dim(),
                       lambda: f"axis must be in [{-x.dim()}, {x.dim()}) for {name} with {x.dim()} dimensions, got {axis}")
    for arg, t in (("scales", scales), ("zero_points", zero_points)):
        torch._check_value(t.dim() == 1 and t.shape[0] == x.shape[axis],
                           lambda: f"{arg} must be 1-D of length {name}.size({axis}), got shape {tuple(t.shape)}")


def _dense_like(t, dtype):
    """The per-tensor ops keep a channels-last 4-D layout, else return contiguous (as the kernels do)."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.empty_like(t, dtype=dtype, memory_format=torch.channels_last)
    return torch.empty(t.shape, dtype=dtype, device=t.device)


@torch.library.register_fake("qbackend::quantize_per_tensor")
def _quantize_per_tensor_fake(x, scale, zero_point, dtype, memory_format=None):
    torch._check_value(memory_format in (None, torch.preserve_format, torch.contiguous_format, torch.channels_last),
                       lambda: "memory_format must be None, torch.preserve_format, torch.contiguous_format or "
                               f"torch.channels_last, got {memory_format}")
    if memory_format == torch.channels_last:
        torch._check_value(x.dim() == 4, lambda: f"memory_format=torch.channels_last takes a 4-D x, got a "
                                                 f"{x.dim()}-D tensor")
        return torch.empty_like(x, dtype=dtype, memory_format=torch.channels_last)
    if memory_format == torch.contiguous_format:
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    return _dense_like(x, dtype)


@torch.library.register_fake("qbackend::quantize_per_channel")
def _quantize_per_channel_fake(x, scales, zero_points, axis, dtype):
    _check_channel_args(x, "x", scales, zero_points, axis)
    return torch.empty(x.shape, dtype=dtype, device=x.device)


@torch.library.register_fake("qbackend::dequantize_per_tensor")
def _dequantize_per_tensor_fake(q, scale, zero_point, out_dtype=torch.float32):
    return _dense_like(q, out_dtype)


@torch.library.register_fake("qbackend::dequantize_per_channel")
def _dequantize_per_channel_fake(q, scales, zero_points, axis, out_dtype=torch.float32):
    _check_channel_args(q, "q", scales, zero_points, axis)
    return torch.empty(q.shape, dtype=out_dtype, device=q.device)


def _is_per_tensor(scale) -> bool:
    if isinstance(scale, numbers.Real):
        return True
    if isinstance(scale, torch.Tensor) and scale.dim() == 0:
        return True
    if isinstance(scale, torch.Tensor) and scale.dim() == 1:
        return False
    raise TypeError(f"scale must be a number, a 0-d tensor or a 1-D tensor, got {type(scale).__name__}"
                    + (f" of shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else ""))


def _channel_params(scale, zero_point, axis):
    if axis is None:
        raise ValueError("axis is required with a 1-D (per-channel) scale tensor")
    if isinstance(zero_point, numbers.Integral) or (isinstance(zero_point, torch.Tensor) and zero_point.dim() == 0):
        zero_point = torch.full(scale.shape, int(zero_point), dtype=torch.int32)
    if not isinstance(zero_point, torch.Tensor):
        raise TypeError(f"zero_point must be an int or an integer tensor, got {type(zero_point).__name__}")
    return scale, zero_point, int(axis)


def quantize(x: torch.Tensor, scale, zero_point, dtype: torch.dtype = torch.uint8, axis: int | None = None):
    """q = clamp(round_half_even(x / scale) + zero_point, qmin, qmax) as a plain uint8/int8 tensor.

    Per-tensor when `scale` is a number or a 0-d tensor; per-channel along `axis` when it is a 1-D
    tensor (then `zero_point` is a 1-D integer tensor or one int for every channel).
    """
    if _is_per_tensor(scale):
        if axis is not None:
            raise ValueError("axis is only meaningful with a 1-D (per-channel) scale tensor")
        return torch.ops.qbackend.quantize_per_tensor(x, float(scale), int(zero_point), dtype)
    scales, zero_points, axis = _channel_params(scale, zero_point, axis)
    return torch.ops.qbackend.quantize_per_channel(x, scales, zero_points, axis, dtype)


def dequantize(q: torch.Tensor, scale, zero_point, axis: int | None = None, out_dtype: torch.dtype = torch.float32):
    """x = (q - zero_point) * scale in fp32 (out_dtype float32 or bfloat16, rounded to nearest even).

    Per-tensor / per-channel exactly as in `quantize`.
    """
    if _is_per_tensor(scale):
        if axis is not None:
            raise ValueError("axis is only meaningful with a 1-D (per-channel) scale tensor")
        return torch.ops.qbackend.dequantize_per_tensor(q, float(scale), int(zero_point), out_dtype)
    scales, zero_points, axis = _channel_params(scale, zero_point, axis)
    return torch.ops.qbackend.dequantize_per_channel(q, scales, zero_points, axis, out_dtype)
