"""Kernel providers as a table: each provider is a record of the functions that prepack and run
Linear and Conv2d, with one signature for all of them.

  native     qbackend's own int8 GEMM (csrc/kernels/gemm_*, torch.ops.qbackend.native_*): Linear and
             convs with groups 1 (a KxK conv as a GEMM over gathered taps), on every AVX2 CPU (AMX,
             AVX512-VNNI or AVX-VNNI where present; plain AVX2 with int16 products, exact at 8 bits);
             depthwise convs (one filter per channel; AVX512-VNNI, or AVX2 with int16 products)
  fbgemm     FBGEMM's C++ API through csrc (torch.ops.qbackend.fbgemm_*)
  onednn     oneDNN through torch's plain-tensor onednn ops (torch.ops.qbackend.onednn_*)
  reference  plain PyTorch fp64 math (qbackend.ops.reference): slow, exact, always available

The dispatcher decides which provider an op instance uses; PackedLinearWeight / PackedConv2dWeight
hold the decision and the provider's packed form.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from . import conv  # noqa: F401  (registers the conv ops' fake impls)
from . import linear  # noqa: F401  (registers the linear ops' fake impls)
from . import reference
from ..core.extension import _C, usable_isa
from ..core.isa import Isa

ops = torch.ops.qbackend


@dataclass(frozen=True)
class Provider:
    """A kernel provider: the functions that prepack and run Linear and Conv2d, and what it can run here."""

    name: str
    # (weight int8 [N, K], x_shape hint or None) -> packed
    prepack_linear: Callable
    # (x, x_scale, x_zp, packed, w_scales, bias, out_scale, out_zp, out_dtype, post_op) -> y
    linear: Callable
    # (x fp32, packed, w_scales, bias, reduce_range, post_op) -> y fp32
    linear_dynamic: Callable
    # (weight int8 [OC, IC/g, KH, KW], w_scales, stride, padding, dilation, groups, x_shape, x_qparams) -> packed
    # x_qparams: (x_scale, x_zero_point) the layer will run with, or None (oneDNN picks its weight
    # format for them: a mismatch costs a weight reorder per call)
    prepack_conv2d: Callable
    # (x, x_scale, x_zp, packed, w_scales, bias, stride, padding, dilation, groups, out_scale, out_zp,
    #  out_dtype, post_op, accum, accum_scale, accum_zp) -> y
    conv2d: Callable
    # (op=None, shape=None) -> whether this provider multiplies full-range 8-bit activations exactly
    # on this CPU (else 7-bit only): for that op instance (op and shape key as `refuses`), or for
    # every op instance it runs when called without them.
    exact_8bit: Callable[..., bool]
    # conv2d with a residual the caller gives up: the result written into accum (same arguments,
    # accum required, returns nothing), or None (the provider has no such form: conv2d is used).
    conv2d_add_: Callable | None = None
    # (op, shape key) -> why this provider cannot run that op instance on this CPU, or None.
    # Shape keys as in qbackend.dispatch.rules; a provider that refuses is skipped by the router.
    refuses: Callable[[str, dict], str | None] = lambda op, shape: None
    # A candidate of the rule table's fallbacks and of tune mode (the reference provider is not:
    # it is slow, for tests and comparisons).
    routed: bool = True


def _fbgemm_exact(op: str | None = None, shape=None) -> bool:
    return _C.fbgemm_isa() in ("avx512_vnni", "avx512_vnni_ymm")


def _is_depthwise(shape) -> bool:
    """One filter per channel (groups = in = out channels > 1): the convs of oneDNN's depthwise kernels."""
    return shape["groups"] == shape["c_in"] == shape["c_out"] > 1


def int32_reduction_refusal(op: str, shape) -> str | None:
    """Why no provider runs this op instance: a reduction past 65536 u8 x s8 products can overflow
    the int32 accumulators every provider uses (None when it fits)."""
    if op == "linear" and shape.get("k", 0) > 65536:
        return "in_features > 65536 (int32 accumulation)"
    if op == "conv2d":
        kh, kw = shape["kernel"]
        if shape["c_in"] // max(shape.get("groups", 1), 1) * kh * kw > 65536:
            return "in_channels/groups x kH x kW > 65536 (int32 accumulation)"
    return None


def _native_refuses(op: str, shape) -> str | None:
    if not _C.native_isa():
        return "the native GEMM needs AVX2 (this CPU or QBACKEND_ISA lacks it)"
    if op == "linear":
        return int32_reduction_refusal(op, shape)
    if op == "conv2d":
        kh, kw = shape["kernel"]
        if shape["groups"] != 1:
            if not _is_depthwise(shape):
                return "it runs convolutions with groups 1, or depthwise ones (groups = in = out channels)"
            dilation = shape.get("dilation", 1)
            dh = dilation if isinstance(dilation, int) else dilation[0]
            if kh * kw > 512 or kh > 64 or kw > 64 or (kh - 1) * dh + 1 > 256:
                return "its depthwise kernels take up to 512 taps, 64 per side"
            return None
        return int32_reduction_refusal(op, shape)
    return f"it has no {op}"


def _onednn_exact(op: str | None = None, shape=None) -> bool:
    """VNNI (AVX512-VNNI or AVX-VNNI): exact. Without it oneDNN pairs products in int16 (vpmaddubsw)
    in its GEMM, dense and grouped convs, but not in its depthwise convs: those are exact at 8 bits
    on every ISA (tests/ops/test_conv2d.py checks them against the fp64 reference under
    QBACKEND_ISA=avx2; the op refuses 8-bit activations on the others, csrc/common/saturation.h)."""
    if usable_isa() >= Isa.AVX512_VNNI or bool(_C.avx_vnni_usable()):
        return True
    return op == "conv2d" and shape is not None and _is_depthwise(shape)


def exact_8bit_activations() -> bool:
    """Whether full-range uint8 activations have an exact route here for Linear, dense convs and
    depthwise convs: the native GEMM (every AVX2 CPU: int16 products without VNNI) with oneDNN's or
    the native depthwise conv, or VNNI for the libraries. False: 7-bit activations
    (observers.default_reduce_range). Grouped convs with several channels per group have no exact
    route without VNNI: routing them with 8-bit activations raises (use reduce_range=True)."""
    return bool(_C.native_isa()) or _onednn_exact()


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(tuple(v)[0]), int(tuple(v)[-1]))


def _onednn_refuses(op: str, shape) -> str | None:
    too_long = int32_reduction_refusal(op, shape)
    if too_long is not None:
        return too_long
    if op == "conv2d":
        stride = shape.get("stride", 1)
        sh, sw = (stride, stride) if isinstance(stride, int) else tuple(stride)
        if shape["groups"] == shape["c_in"] and shape["c_out"] > shape["c_in"] and sh != sw:
            return "its depthwise convs with a channel multiplier and unequal strides compute wrong values"
        return None
    return None if op == "linear" else f"it has no {op}"


def _ref_float(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return y if dtype in reference.QRANGE else y.to(dtype)


_REF_OUT_DTYPES = (torch.uint8, torch.int8, torch.float32, torch.bfloat16)


def _ref_check_scale(s, name: str) -> None:
    f = reference.f32(float(s)) if math.isfinite(float(s)) else float(s)
    if not (math.isfinite(float(s)) and float(s) > 0 and f > 0 and math.isfinite(1.0 / f)):
        raise ValueError(f"{name} must be a finite positive number representable as a float32 scale, got {s!r}")


def _ref_check_int8(t, zp, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in reference.QRANGE:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must have dtype uint8 or int8 (a quantized activation), got {got}")
    lo, hi = reference.QRANGE[t.dtype]
    if not lo <= int(zp) <= hi:
        raise ValueError(f"{name}_zero_point must be in [{lo}, {hi}] for {t.dtype}, got {zp}")


def _ref_checks(x, x_scale, x_zp, out_scale, out_zp, out_dtype, post_op) -> None:
    """The argument checks every provider makes (checks.h), for the reference provider's ops."""
    _ref_check_int8(x, x_zp, "x")
    _ref_check_scale(x_scale, "x_scale")
    if out_dtype not in _REF_OUT_DTYPES:
        raise TypeError(f"output_dtype must be uint8, int8, float32 or bfloat16, got {out_dtype}")
    if out_dtype in reference.QRANGE:
        _ref_check_scale(out_scale, "output_scale")
        lo, hi = reference.QRANGE[out_dtype]
        if not lo <= int(out_zp) <= hi:
            raise ValueError(f"output_zero_point must be in [{lo}, {hi}] for {out_dtype}, got {out_zp}")
    if post_op not in ("none", "relu", "gelu"):
        raise ValueError(f"post_op must be 'none', 'relu' or 'gelu', got {post_op!r}")


def _ref_check_features(x, packed) -> None:
    if x.dim() < 1 or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"x must have in_features = {packed.shape[1]} in its last dimension, got shape "
                         f"{tuple(x.shape)}")


def _ref_linear(x, x_scale, x_zp, packed, w_scales, bias, out_scale, out_zp, out_dtype, post_op):
    _ref_checks(x, x_scale, x_zp, out_scale, out_zp, out_dtype, post_op)
    _ref_check_features(x, packed)
    y = reference.linear(x, x_scale, x_zp, packed, w_scales, bias, out_scale, out_zp, out_dtype, post_op)
    return _ref_float(y, out_dtype)


def _ref_linear_dynamic(x, packed, w_scales, bias, reduce_range, post_op):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"x must have dtype torch.float32, got {x.dtype if isinstance(x, torch.Tensor) else type(x)}")
    _ref_check_features(x, packed)
    if post_op not in ("none", "relu", "gelu"):
        raise ValueError(f"post_op must be 'none', 'relu' or 'gelu', got {post_op!r}")
    if x.numel() == 0:  # no rows: no range to quantize over
        return x.new_empty((*x.shape[:-1], packed.shape[0]))
    scale, zp = reference.choose_dynamic_qparams(x, reduce_range)
    xq = reference.quantize(x, scale, zp, torch.uint8)
    return reference.linear(xq, scale, zp, packed, w_scales, bias, post_op=post_op).float()


def _ref_conv2d(x, x_scale, x_zp, packed, w_scales, bias, stride, padding, dilation, groups, out_scale, out_zp,
                out_dtype, post_op, accum=None, accum_scale=1.0, accum_zp=0):
    _ref_checks(x, x_scale, x_zp, out_scale, out_zp, out_dtype, post_op)
    if x.dim() != 4 or x.shape[1] != packed.shape[1] * groups:
        raise ValueError(f"x must be 4-D [N, C, H, W] with C = in_channels = {packed.shape[1] * groups}, got shape "
                         f"{tuple(x.shape)}")
    if accum is not None:
        _ref_check_int8(accum, accum_zp, "accum")
        _ref_check_scale(accum_scale, "accum_scale")
    y = reference.conv2d(x, x_scale, x_zp, packed, w_scales, bias, stride, padding, dilation, groups, out_scale,
                         out_zp, out_dtype, post_op, accum, accum_scale, accum_zp)
    return _ref_float(y, out_dtype).contiguous(memory_format=torch.channels_last)


PROVIDERS: dict[str, Provider] = {
    "native": Provider(
        name="native",
        prepack_linear=lambda w, x_shape=None: ops.native_linear_prepack(w),
        linear=ops.native_linear,
        linear_dynamic=ops.native_linear_dynamic,
        prepack_conv2d=lambda w, s, stride, padding, dilation, groups, x_shape=None, x_qparams=None:
            ops.native_conv2d_prepack(w, stride, padding, dilation, groups),
        conv2d=ops.native_conv2d,
        # u8 x s8 with vpdpbusd / tdpbusd, or int16 products (vpmaddwd) on AVX2 without VNNI: exact
        # wherever it runs (it refuses CPUs without AVX2).
        exact_8bit=lambda op=None, shape=None: bool(_C.native_isa()),
        conv2d_add_=ops.native_conv2d_add_,
        refuses=_native_refuses,
    ),
    "fbgemm": Provider(
        name="fbgemm",
        prepack_linear=lambda w, x_shape=None: ops.fbgemm_linear_prepack(w),
        linear=ops.fbgemm_linear,
        linear_dynamic=ops.fbgemm_linear_dynamic,
        prepack_conv2d=lambda w, s, stride, padding, dilation, groups, x_shape=None, x_qparams=None:
            ops.fbgemm_conv2d_prepack(w, stride, padding, dilation, groups),
        conv2d=ops.fbgemm_conv2d,
        exact_8bit=_fbgemm_exact,
        refuses=int32_reduction_refusal,
    ),
    "onednn": Provider(
        name="onednn",
        prepack_linear=lambda w, x_shape=None: ops.onednn_linear_prepack(w, x_shape),
        linear=ops.onednn_linear,
        linear_dynamic=ops.onednn_linear_dynamic,
        prepack_conv2d=lambda w, s, stride, padding, dilation, groups, x_shape=None, x_qparams=None:
            ops.onednn_conv2d_prepack(w, s, stride, padding, dilation, groups, x_shape, *(x_qparams or (1.0, 0))),
        conv2d=ops.onednn_conv2d,
        exact_8bit=_onednn_exact,
        conv2d_add_=ops.onednn_conv2d_add_,
        refuses=_onednn_refuses,
    ),
    "reference": Provider(
        name="reference",
        prepack_linear=lambda w, x_shape=None: w,
        linear=_ref_linear,
        linear_dynamic=_ref_linear_dynamic,
        prepack_conv2d=lambda w, s, stride, padding, dilation, groups, x_shape=None, x_qparams=None: w,
        conv2d=_ref_conv2d,
        exact_8bit=lambda op=None, shape=None: True,
        routed=False,
    ),
}


def get_provider(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}") from None
