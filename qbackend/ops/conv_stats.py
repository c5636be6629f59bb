"""The fake (meta) impls of the conv statistics of GPTQ and bias correction (csrc/ops/conv_stats_ops.cpp,
used by qbackend.algorithms.gptq): torch.ops.qbackend.im2col_column_sums, per image the sums of a conv's
im2col columns over its output positions, without forming them; torch.ops.qbackend.sampled_im2col,
the im2col rows at every step-th output position in each direction."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::im2col_column_sums")
def _im2col_column_sums_fake(x, kernel, stride, padding, dilation):
    torch._check_value(x.dim() == 4, lambda: f"im2col_column_sums: x must be 4-D [N, C, H, W], got {x.dim()}-D")
    return x.new_empty(x.shape[0], x.shape[1] * kernel[0] * kernel[1])


@torch.library.register_fake("qbackend::sampled_im2col")
def _sampled_im2col_fake(x, kernel, stride, padding, dilation, step):
    torch._check_value(x.dim() == 4, lambda: f"sampled_im2col: x must be 4-D [N, C, H, W], got {x.dim()}-D")
    torch._check_value(step >= 1, lambda: f"sampled_im2col: step must be >= 1, got {step}")
    kh, kw = (kernel[0], kernel[-1])
    rows = []
    for d, k in ((2, kh), (3, kw)):
        s, p, dl = stride[min(d - 2, len(stride) - 1)], padding[min(d - 2, len(padding) - 1)], \
            dilation[min(d - 2, len(dilation) - 1)]
        out = max((x.shape[d] + 2 * p - dl * (k - 1) - 1) // s + 1, 0)
        rows.append(-(-out // step))
    return x.new_empty(x.shape[0] * rows[0] * rows[1], x.shape[1] * kh * kw)
