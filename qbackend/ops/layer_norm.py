"""The fake (meta) impl of torch.ops.qbackend.layer_norm_quantize (csrc/ops/layer_norm_ops.cpp):
(residual add +) LayerNorm over the last dimension returning both the float output and its
per-channel quantized form, in one pass over the row."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)


def residual_broadcasts(residual_shape, x_shape) -> bool:
    """Whether a residual of residual_shape can be added to x of x_shape by the op: it has at most
    x's dimensions and, without its leading 1s, is a suffix of x's shape (x's shape itself, or
    broadcast over leading dimensions as position embeddings [1, S, C] over the batch). The C++
    check is broadcasts_over_leading_dims in csrc/ops/layer_norm_ops.cpp."""
    r, x = list(residual_shape), list(x_shape)
    if len(r) > len(x):
        return False
    while len(r) > 1 and r[0] == 1:
        r = r[1:]
    return x[len(x) - len(r):] == r


@torch.library.register_fake("qbackend::layer_norm_quantize")
def _layer_norm_quantize_fake(x, residual, weight, bias, eps, scales, zero_point, dtype, qmax):
    torch._check_type(x.dtype == torch.float32, lambda: "x must be float32")
    torch._check_value(x.dim() >= 1, lambda: "x must have a last dimension")
    if residual is not None:
        torch._check_value(residual_broadcasts(residual.shape, x.shape),
                           lambda: "residual must have x's shape or broadcast to it over leading dimensions")
    torch._check_value(scales.dim() == 1 and scales.shape[0] == x.shape[-1],
                       lambda: "scales must be 1-D with x's last dimension")
    return torch.empty(x.shape, dtype=torch.float32, device=x.device), torch.empty(x.shape, dtype=dtype, device=x.device)
