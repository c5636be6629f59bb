"""The reference provider: plain PyTorch fp64 math with the exact integer semantics of the kernels.

Every fast provider (fbgemm, onednn, later native) is tested against these functions. They are
slow on purpose and clear on purpose: integer accumulation is exact in fp64 for the sizes we use
(|acc| < 2**53), and rounding is round-half-to-even, like torch and the kernels.

Semantics shared by all providers (the contract):
  quantize:    q = clamp(round_half_even(x / scale) + zero_point, qmin, qmax)
  dequantize:  x = (q - zero_point) * scale
  linear:      acc[m, n] = sum_k (x[m, k] - x_zp) * w[n, k]            (weights symmetric, zp 0)
               y = acc * x_scale * w_scale[n] + bias[n];  y = post_op(y)
               out = y (fp32/bf16)  or  quantize(y, out_scale, out_zp)   (uint8/int8)
  conv2d:      the same, with acc the int conv of (x - x_zp) with w over padded input, where
               padding holds real zeros (i.e. x_zp in the quantized domain)
  conv2d + sum: y = conv(...) + dequantize(accum, accum_scale, accum_zp), then relu, then quantize
  global_avg_pool2d: y[n, c] = quantize(mean_hw dequantize(x[n, c]), out_scale, out_zp)
Scales are float32 values (a Python float is rounded to float32 first, as the kernels do).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

QRANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


def f32(v: float) -> float:
    """Round a Python float to the nearest float32, as the kernels see it."""
    return float(torch.tensor(v, dtype=torch.float32))


def _per_channel_view(v: torch.Tensor, ndim: int, axis: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def quantize(x: torch.Tensor, scale, zero_point, dtype: torch.dtype, axis: int | None = None) -> torch.Tensor:
    qmin, qmax = QRANGE[dtype]
    xd = x.double()
    if axis is None:
        s = f32(float(scale))
        z = int(zero_point)
    else:
        axis = axis % x.dim()
        s = _per_channel_view(scale.float().double(), x.dim(), axis)
        z = _per_channel_view(zero_point.double(), x.dim(), axis)
    return torch.clamp(torch.round(xd / s) + z, qmin, qmax).to(dtype)


def dequantize(q: torch.Tensor, scale, zero_point, axis: int | None = None) -> torch.Tensor:
    qd = q.double()
    if axis is None:
        return (qd - int(zero_point)) * f32(float(scale))
    axis = axis % q.dim()
    s = _per_channel_view(scale.float().double(), q.dim(), axis)
    z = _per_channel_view(zero_point.double(), q.dim(), axis)
    return (qd - z) * s


def apply_post_op(y: torch.Tensor, post_op: str) -> torch.Tensor:
    if post_op == "none":
        return y
    if post_op == "relu":
        return torch.relu(y)
    if post_op == "gelu":
        return F.gelu(y)
    raise ValueError(f"post_op must be 'none', 'relu' or 'gelu', got {post_op!r}")


def _finish(y: torch.Tensor, out_scale: float, out_zp: int, out_dtype: torch.dtype) -> torch.Tensor:
    """y is fp64. Integer outputs are quantized; float outputs are returned in fp64 for comparison."""
    if out_dtype in QRANGE:
        return quantize(y, out_scale, out_zp, out_dtype)
    return y


def linear_fp64(x_q, x_scale, x_zp, w_q, w_scales, bias, post_op="none"):
    """fp64 output of the int8 linear before any output quantization."""
    acc = (x_q.double() - int(x_zp)) @ w_q.double().t()  # exact integers
    y = acc * f32(x_scale) * w_scales.float().double()
    if bias is not None:
        y = y + bias.float().double()
    return apply_post_op(y, post_op)


def linear(x_q, x_scale, x_zp, w_q, w_scales, bias, out_scale=1.0, out_zp=0,
           out_dtype=torch.float32, post_op="none"):
    return _finish(linear_fp64(x_q, x_scale, x_zp, w_q, w_scales, bias, post_op), out_scale, out_zp, out_dtype)


def conv2d_fp64(x_q, x_scale, x_zp, w_q, w_scales, bias, stride, padding, dilation, groups,
                accum=None, accum_scale=1.0, accum_zp=0, post_op="none"):
    """fp64 conv output (NCHW, whatever memory format x has), with optional residual add."""
    xd = x_q.double() - int(x_zp)  # zero padding here == x_zp padding in the quantized domain
    acc = F.conv2d(xd, w_q.double(), None, stride, padding, dilation, groups)
    y = acc * f32(x_scale) * w_scales.float().double().reshape(1, -1, 1, 1)
    if bias is not None:
        y = y + bias.float().double().reshape(1, -1, 1, 1)
    if accum is not None:
        y = y + dequantize(accum, accum_scale, accum_zp)
    return apply_post_op(y, post_op)


def conv2d(x_q, x_scale, x_zp, w_q, w_scales, bias, stride, padding, dilation, groups,
           out_scale=1.0, out_zp=0, out_dtype=torch.float32, post_op="none",
           accum=None, accum_scale=1.0, accum_zp=0):
    y = conv2d_fp64(x_q, x_scale, x_zp, w_q, w_scales, bias, stride, padding, dilation, groups,
                    accum, accum_scale, accum_zp, post_op)
    return _finish(y, out_scale, out_zp, out_dtype)


def global_avg_pool2d(x_q, x_scale, x_zp, out_scale, out_zp, out_dtype):
    """[N, C, 1, 1]: the mean over H x W of the dequantized input, quantized (fp64, exact sums)."""
    mean = (x_q.double() - int(x_zp)).sum(dim=(2, 3), keepdim=True) / (x_q.shape[2] * x_q.shape[3])
    return quantize(mean * f32(x_scale), out_scale, out_zp, out_dtype)


def choose_dynamic_qparams(x: torch.Tensor, reduce_range: bool) -> tuple[float, int]:
    """Asymmetric uint8 qparams covering [min(x, 0), max(x, 0)] (7-bit with reduce_range).

    The same rule the dynamic linear kernels use, so their activation rounding can be reproduced.
    """
    qmax = 127 if reduce_range else 255
    lo = min(float(x.min()), 0.0)
    hi = max(float(x.max()), 0.0)
    scale = f32((hi - lo) / qmax) if hi > lo else 1.0
    if scale == 0.0 or not math.isfinite(1.0 / scale):
        scale = 1.0
    zp = int(min(max(round(-lo / scale), 0), qmax))
    return scale, zp


def quantize_per_row(x: torch.Tensor, qmax: int = 255) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8, scale float32, zero_point int32) of a float32 x [..., K], each row over its own
    range by choose_qparams' asymmetric rule (lo = min(finite min, 0), hi = max(finite max, 0); an
    all-zero or all-non-finite row gets scale 1, zero point 0): q = min(clamp(round(x / scale) +
    zero_point, 0, 255), qmax), the division in float32; NaN -> zero point, +-inf -> qmax / 0."""
    rows = x.float().reshape(-1, x.shape[-1])
    finite = torch.isfinite(rows)
    lo = torch.where(finite, rows, torch.inf).amin(dim=1).double().clamp(max=0.0)
    hi = torch.where(finite, rows, -torch.inf).amax(dim=1).double().clamp(min=0.0)
    lo = torch.where(torch.isinf(lo), 0.0, lo)
    hi = torch.where(torch.isinf(hi), 0.0, hi)
    scale = ((hi - lo) / qmax).float().clamp(min=torch.finfo(torch.float32).eps)
    scale = torch.where(lo == hi, torch.ones_like(scale), scale)
    zp = (-torch.round(lo / scale.double())).clamp(0, qmax).to(torch.int32)
    zp = torch.where(lo == hi, torch.zeros_like(zp), zp)
    v = torch.round(rows / scale[:, None]) + zp[:, None].float()
    v = torch.where(torch.isnan(rows), zp[:, None].float(), v)
    q = v.clamp(0, 255).clamp(max=qmax).to(torch.uint8)
    lead = x.shape[:-1]
    return q.reshape(x.shape), scale.reshape(lead), zp.reshape(lead)


def per_row_dequantize(acc, scale, zero_point, colsum, bias=None) -> torch.Tensor:
    """y[m, n] = (acc[m, n] - zp[m] * colsum[n]) * scale[m] + bias[n], each step one float32
    rounding, in that order (the C++ op's contract)."""
    rows = acc.float().reshape(-1, acc.shape[-1])
    zc = zero_point.reshape(-1, 1).float() * colsum.float()[None, :]
    y = (rows - zc) * scale.reshape(-1, 1).float()
    if bias is not None:
        y = y + bias.float()[None, :]
    return y.reshape(acc.shape)


def token_linear_fp64(x: torch.Tensor, w_q: torch.Tensor, w_scales: torch.Tensor, bias, qmax: int = 255,
                      post_op: str = "none") -> torch.Tensor:
    """A Linear reading float x quantized per row (quantize_per_row), in fp64 on the same integers:
    y[m, n] = scale[m] * w_scale[n] * sum_k (q[m, k] - zp[m]) * w[n, k] + bias[n], then post_op."""
    q, scale, zp = quantize_per_row(x, qmax)
    xd = (q.double() - zp.double()[..., None]) * scale.double()[..., None]
    y = xd @ (w_q.double() * w_scales.float().double()[:, None]).t()
    if bias is not None:
        y = y + bias.double()
    return apply_post_op(y, post_op)


_FMIX64 = (-49064778989728563, -4265267296055464877)  # MurmurHash3's fmix64 constants as int64


def _shr(h: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (h >> bits) & ((1 << (64 - bits)) - 1)


def row_keys(rows: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """torch.ops.qbackend.row_keys in torch int64 ops (wrapping): h = sum over c of the 32 bits of
    rows[r, c] as a signed integer times multipliers[c], then MurmurHash3's 64-bit finalizer."""
    h = (rows.float().contiguous().view(torch.int32).to(torch.int64) * multipliers).sum(1)
    h = h ^ _shr(h, 33)
    h = h * _FMIX64[0]
    h = h ^ _shr(h, 33)
    h = h * _FMIX64[1]
    return h ^ _shr(h, 33)


def quantize_weight_rows(w: torch.Tensor, scales: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """The int8 levels of a float32 weight [N, ...] with float32 scales [N] (one per output channel):
    clamp(round_half_even(w / s), qmin, qmax), the division in float64 (qbackend::quantize_weight_rows)."""
    view = (-1,) + (1,) * (w.dim() - 1)
    q = w.double() / scales.double().reshape(view)
    return q.round().clamp(qmin, qmax).to(torch.int8)
