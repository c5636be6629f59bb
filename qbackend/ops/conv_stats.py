"""The fake (meta) impl of torch.ops.qbackend.im2col_column_sums (csrc/ops/conv_stats_ops.cpp): per
image, the sums of a conv's im2col columns over its output positions, without forming them (the
conv statistics of GPTQ and bias correction, qbackend.algorithms.gptq)."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::im2col_column_sums")
def _im2col_column_sums_fake(x, kernel, stride, padding, dilation):
    torch._check_value(x.dim() == 4, lambda: f"im2col_column_sums: x must be 4-D [N, C, H, W], got {x.dim()}-D")
    return x.new_empty(x.shape[0], x.shape[1] * kernel[0] * kernel[1])
