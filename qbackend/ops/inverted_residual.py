"""The fused inverted-residual block op's Python side: its fake (meta) impl, and `inverted_residual`,
which calls it from three native-packed convs.

torch.ops.qbackend.native_inverted_residual (csrc/providers/native_inverted_residual.cpp) runs an
optional 1x1 expansion conv, a depthwise conv and a 1x1 projection conv (with an optional int8
residual) in tiles of output rows, each stage requantized to int8 as its own conv op would: the
result equals the three native conv ops called in turn, bit for bit.
"""
from __future__ import annotations

import torch

from .conv import conv2d_output_hw
from .linear import check_same_device


@torch.library.register_fake("qbackend::native_inverted_residual")
def _native_inverted_residual_fake(x, x_scale, x_zero_point, expand_w, expand_scales, expand_bias, expand_scale,
                                   expand_zero_point, expand_dtype, expand_post_op, dw_w, dw_scales, dw_bias, stride,
                                   padding, dilation, dw_scale, dw_zero_point, dw_dtype, dw_post_op, project_w,
                                   project_scales, project_bias, output_scale, output_zero_point, output_dtype,
                                   post_op, accum=None, accum_scale=1.0, accum_zero_point=0):
    check_same_device(x, expand_w=expand_w, dw_w=dw_w, project_w=project_w, accum=accum)
    torch._check_value(x.dim() == 4, lambda: "x must be 4-D [N, C, H, W]")
    oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], (dw_w.shape[0], dw_w.shape[1]), stride, padding, dilation)
    return torch.empty((x.shape[0], project_scales.shape[0], oh, ow), dtype=output_dtype, device=x.device,
                       memory_format=torch.channels_last)
