"""What the quantized modules share about their activations: the qparams they were built with,
checked once, and the output-side clamp that turns a fused ReLU into ReLU6."""
from __future__ import annotations

import torch

from ..core.generation import Tracked

QDTYPES = (torch.uint8, torch.int8)
OUT_DTYPES = (torch.uint8, torch.int8, torch.float32)


def check_qparams(scale, zero_point, dtype: torch.dtype, what: str) -> tuple[float, int]:
    scale, zero_point = float(scale), int(zero_point)
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"{what} scale must be finite and positive, got {scale}")
    lo, hi = (0, 255) if dtype == torch.uint8 else (-128, 127)
    if not lo <= zero_point <= hi:
        raise ValueError(f"{what} zero point {zero_point} is outside the {dtype} range [{lo}, {hi}]")
    return scale, zero_point


def uses_8_bits(dtype: torch.dtype, qmax: int | None) -> bool:
    """Whether activations of this dtype with this largest level use the full 8-bit range, not the
    7-bit one that the libraries need without VNNI (int8 always; uint8 above 127; qmax None: the dtype's)."""
    return dtype == torch.int8 or qmax is None or qmax > 127


def dtype_top(dtype: torch.dtype) -> int:
    """The largest level of an 8-bit activation dtype."""
    return 255 if dtype == torch.uint8 else 127


def reduced_qmax(qmax: int | None, dtype: torch.dtype) -> int | None:
    """qmax when it is below the dtype's top level (7-bit activations), else None (no clamp)."""
    return qmax if qmax is not None and qmax < dtype_top(dtype) else None


def output_clamp(post_op: str, out_dtype: torch.dtype, out_scale: float, out_zp: int,
                 out_qmax: int | None) -> float | int | None:
    """The upper clamp applied after the kernel: ReLU6's bound, and/or the output's qmax when it is
    below the dtype's (7-bit activations on CPUs without VNNI: the epilogue saturates at 255)."""
    bound = relu6_bound(out_dtype, out_scale, out_zp) if post_op == "relu6" else None
    if out_dtype != torch.float32 and out_qmax is not None and out_qmax < (255 if out_dtype == torch.uint8 else 127):
        bound = out_qmax if bound is None else min(bound, out_qmax)
    return bound


def relu6_bound(out_dtype: torch.dtype, out_scale: float, out_zp: int) -> float | int | None:
    """The upper clamp that makes a fused ReLU a ReLU6 on the output: 6.0 for float outputs; for
    integer outputs the level of 6.0 (quantize(6.0)), or None when that saturates anyway."""
    if out_dtype == torch.float32:
        return 6.0
    hi = 255 if out_dtype == torch.uint8 else 127
    q6 = round(6.0 / out_scale) + out_zp
    return None if q6 >= hi else int(q6)


class ActivationBorder(Tracked):
    """A module that writes (or reads) one activation value of the model's table, named by `value`,
    with qparams that `set_qparams` replaces: Quantize, Dequantize and the fused ops ending in a
    quantize (FusedAttention, LayerNormQuantize). Rebinding a loaded model to a CPU that needs 7-bit
    activations updates every one of them (serialization/rebind.py)."""

    value: str | None

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        raise NotImplementedError


POST_OPS = ("none", "relu", "relu6", "gelu")


def check_post_op(post_op: str) -> str:
    if post_op not in POST_OPS:
        raise ValueError(f"post_op must be one of {', '.join(POST_OPS)}, got {post_op!r}")
    return post_op


class StaticQParamsMixin(Tracked):
    """What QuantizedLinear and QuantizedConv2d share: the packed weight and the activation
    qparams they are built with (`_init_static`, checked once), the activation values they read
    and write (`x_value`, `out_value`, `accum_value`: keys of the model's activation table, set by
    the lowering), and setters that keep the derived clamp right when qparams change (a model
    requantized for another CPU)."""

    x_value: str | None = None
    out_value: str | None = None
    accum_value: str | None = None
    has_accum: bool = False

    def _init_static(self, packed, x_qparams: tuple[float, int], x_dtype: torch.dtype,
                     out_qparams: tuple[float, int] | None, out_dtype: torch.dtype, post_op: str,
                     out_qmax: int | None) -> None:
        if x_dtype not in QDTYPES:
            raise TypeError(f"x_dtype must be uint8 or int8, got {x_dtype}")
        if out_dtype not in OUT_DTYPES:
            raise TypeError(f"out_dtype must be uint8, int8 or float32, got {out_dtype}")
        self.packed = packed
        self.x_dtype = x_dtype
        self.x_scale, self.x_zero_point = check_qparams(*x_qparams, x_dtype, "input")
        self.out_dtype = out_dtype
        if out_dtype == torch.float32:
            self.out_scale, self.out_zero_point = 1.0, 0
        else:
            if out_qparams is None:
                raise ValueError("an integer output needs out_qparams")
            self.out_scale, self.out_zero_point = check_qparams(*out_qparams, out_dtype, "output")
        self.post_op = check_post_op(post_op)
        self._kernel_post_op = "relu" if post_op == "relu6" else post_op  # the clamp makes it ReLU6
        self.out_qmax = out_qmax
        self._clamp_max = output_clamp(post_op, out_dtype, self.out_scale, self.out_zero_point, out_qmax)

    @property
    def provider(self) -> str:
        return self.packed.provider_name

    def _qparams_repr(self) -> str:
        out = ("float32" if self.out_dtype == torch.float32
               else f"{self.out_dtype}(scale={self.out_scale:.4g}, zp={self.out_zero_point})")
        return (f"provider={self.provider}, x={self.x_dtype}(scale={self.x_scale:.4g}, zp={self.x_zero_point}), "
                f"out={out}, post_op={self.post_op}")

    def set_input_qparams(self, scale: float, zero_point: int) -> None:
        self.x_scale, self.x_zero_point = check_qparams(scale, zero_point, self.x_dtype, "input")

    def set_output_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        if self.out_dtype == torch.float32:
            raise ValueError("this layer writes float32: it has no output qparams")
        self.out_scale, self.out_zero_point = check_qparams(scale, zero_point, self.out_dtype, "output")
        self.out_qmax = qmax
        self._clamp_max = output_clamp(self.post_op, self.out_dtype, self.out_scale, self.out_zero_point, qmax)

    def set_accum_qparams(self, scale: float, zero_point: int) -> None:
        if not getattr(self, "has_accum", False):
            raise ValueError("this layer has no residual input")
        self.accum_scale, self.accum_zero_point = check_qparams(scale, zero_point, self.accum_dtype, "accum")
