"""The fake (meta) impls of the conv statistics of GPTQ and bias correction (csrc/ops/conv_stats_ops.cpp,
used by qbackend.algorithms.gptq): torch.ops.qbackend.im2col_column_sums, per image the sums of a conv's
im2col columns over its output positions, without forming them; torch.ops.qbackend.sampled_im2col,
the im2col rows at every step-th output position in each direction."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


def _pair(v) -> tuple:
    """An int[2] argument given as one value or two (as the C++ ops take it)."""
    return v[0], v[-1]


@torch.library.register_fake("qbackend::im2col_column_sums")
def _im2col_column_sums_fake(x, kernel, stride, padding, dilation):
    torch._check_value(x.dim() == 4, lambda: f"im2col_column_sums: x must be 4-D [N, C, H, W], got {x.dim()}-D")
    kh, kw = _pair(kernel)
    return x.new_empty(x.shape[0], x.shape[1] * kh * kw)


@torch.library.register_fake("qbackend::sampled_im2col")
def _sampled_im2col_fake(x, kernel, stride, padding, dilation, step):
    torch._check_value(x.dim() == 4, lambda: f"sampled_im2col: x must be 4-D [N, C, H, W], got {x.dim()}-D")
    torch._check_value(step >= 1, lambda: f"sampled_im2col: step must be >= 1, got {step}")

    def rows(size, k, s, p, d):  # every step-th of the conv's output positions along one dimension
        return -(-max((size + 2 * p - d * (k - 1) - 1) // s + 1, 0) // step)

    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, padding, dilation))
    return x.new_empty(x.shape[0] * rows(x.shape[2], kh, sh, ph, dh) * rows(x.shape[3], kw, sw, pw, dw),
                       x.shape[1] * kh * kw)
