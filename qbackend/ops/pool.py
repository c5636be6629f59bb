"""Int8 pooling: the fake impls of torch.ops.qbackend.max_pool2d (csrc/ops/pool_ops.cpp), which
pools uint8/int8 activations exactly (max commutes with dequantize) in channels-last, and of
torch.ops.qbackend.global_avg_pool2d, the mean over H x W requantized to the output's qparams
(the arithmetic: qbackend.ops.reference.global_avg_pool2d)."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)


def _pair(v, default):
    if len(v) == 0:
        return default
    return (v[0], v[1]) if len(v) == 2 else (v[0], v[0])


def pooled_size(n, k, pad, stride, dil, ceil_mode):
    out = (n + 2 * pad - dil * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= n + pad:
        out -= 1
    return out


@torch.library.register_fake("qbackend::max_pool2d")
def _max_pool2d_fake(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    torch._check_value(x.dim() == 4, lambda: "x must be 4-D [N, C, H, W]")
    k = _pair(kernel_size, (1, 1))
    s = _pair(stride, k)
    p, d = _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    oh = pooled_size(x.shape[2], k[0], p[0], s[0], d[0], ceil_mode)
    ow = pooled_size(x.shape[3], k[1], p[1], s[1], d[1], ceil_mode)
    torch._check_value(oh > 0 and ow > 0, lambda: f"max_pool2d: the output would be empty (input {x.shape[2]}x"
                       f"{x.shape[3]}, kernel {k[0]}x{k[1]}, stride {s[0]}x{s[1]})")
    return torch.empty((x.shape[0], x.shape[1], oh, ow), dtype=x.dtype, device=x.device,
                       memory_format=torch.channels_last)


@torch.library.register_fake("qbackend::global_avg_pool2d")
def _global_avg_pool2d_fake(x, x_scale, x_zero_point, output_scale, output_zero_point, output_dtype):
    torch._check_value(x.dim() == 4, lambda: "x must be 4-D [N, C, H, W]")
    torch._check_value(x.dtype in (torch.uint8, torch.int8), lambda: f"x must be a uint8 or int8 tensor, got {x.dtype}")
    torch._check_value(output_dtype in (torch.uint8, torch.int8),
                       lambda: f"output_dtype must be uint8 or int8, got {output_dtype}")
    return torch.empty((x.shape[0], x.shape[1], 1, 1), dtype=output_dtype, device=x.device,
                       memory_format=torch.channels_last)
