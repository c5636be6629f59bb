"""FusedAttention: a transformer's attention core (torch's scaled_dot_product_attention in the
captured graph) as one qbackend::attention call, with the quantize of its output fused in.

Float q, k, v (and the mask) in; out in q's float dtype (what SDPA returns) or, when the lowering
fused the Quantize border that followed it, uint8/int8 with that border's qparams (`value` names the activation, so a model
requantized for another CPU updates it like a Quantize). `bf16_products`: the two matrix products
in bf16 with fp32 accumulation where the CPU has AVX512-BF16 (decided by the kernel on each call,
so a model saved on a BF16 machine runs fp32 products elsewhere); False keeps them fp32.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .activation import ActivationBorder, QDTYPES, check_qparams, reduced_qmax

ops = torch.ops.qbackend


class FusedAttention(ActivationBorder, nn.Module):
    """An attention core (SDPA) on qbackend::attention, with the quantize behind it fused where there is one."""

    def __init__(self, scale: float | None = None, is_causal: bool = False, bf16_products: bool = False,
                 out_dtype: torch.dtype = torch.float32, out_scale: float = 1.0, out_zero_point: int = 0,
                 qmax: int | None = None, value: str | None = None):
        super().__init__()
        if out_dtype not in (torch.float32, torch.bfloat16, *QDTYPES):
            raise TypeError(f"out_dtype must be float32, bfloat16, uint8 or int8, got {out_dtype}")
        if scale is not None and not math.isfinite(float(scale)):
            raise ValueError(f"scale must be finite, got {scale}")
        self.scale = None if scale is None else float(scale)
        self.is_causal, self.bf16_products = bool(is_causal), bool(bf16_products)
        self.out_dtype, self.value = out_dtype, value
        self.out_scale, self.out_zero_point, self.qmax = 1.0, 0, None
        if out_dtype in QDTYPES:
            self.set_qparams(out_scale, out_zero_point, qmax)

    def set_qparams(self, scale: float, zero_point: int, qmax: int | None = None) -> None:
        """The quantized output's qparams (qmax: the largest level when below the dtype's)."""
        self.out_scale, self.out_zero_point = check_qparams(scale, zero_point, self.out_dtype, "attention output")
        self.qmax = reduced_qmax(qmax, self.out_dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        y = ops.attention(q, k, v, mask, scale, self.is_causal, self.out_dtype, self.out_scale, self.out_zero_point,
                          self.bf16_products)
        if self.qmax is not None:
            y = torch.clamp_max(y, self.qmax)
        return y

    def extra_repr(self) -> str:
        s = f"scale={self.scale}, is_causal={self.is_causal}, bf16_products={self.bf16_products}"
        if self.out_dtype in QDTYPES:
            s += f", out {self.value}: {self.out_dtype}(scale={self.out_scale:.4g}, zp={self.out_zero_point})"
        return s
