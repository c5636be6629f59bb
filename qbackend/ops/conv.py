"""Conv2d ops: fake (meta) impls of torch.ops.qbackend.{fbgemm,onednn,native}_conv2d[_prepack].

The C++ kernels (csrc/providers/fbgemm_conv.cpp, onednn_conv.cpp, native_conv.cpp: groups 1 or depthwise) register the ops when the
extension loads; the fake impls give torch.compile / torch.export their output shapes (NCHW
logical shape, channels-last memory, like the kernels). Semantics: qbackend.ops.reference.conv2d.
Users call them through PackedConv2dWeight.
"""
from __future__ import annotations

import torch

from ..core.extension import _C
from .library import ops_named
from .linear import check_same_device


def _pair(v):
    return (v[0], v[1]) if len(v) == 2 else (v[0], v[0])


def conv2d_output_hw(h, w, kernel, stride, padding, dilation):
    """Output spatial size of a conv2d (the same formula as the kernels)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, _pair(stride), _pair(padding), _pair(dilation)
    return ((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


def _conv_out(x, out_channels, kernel, stride, padding, dilation, dtype):
    torch._check_value(x.dim() == 4, lambda: "x must be 4-D [N, C, H, W]")
    oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], kernel, stride, padding, dilation)
    return torch.empty((x.shape[0], out_channels, oh, ow), dtype=dtype, device=x.device,
                       memory_format=torch.channels_last)


@torch.library.register_fake("qbackend::fbgemm_conv2d_prepack")
def _fbgemm_conv2d_prepack_fake(weight, stride, padding, dilation, groups):
    oc, icg, kh, kw = weight.shape
    return weight.new_empty((oc, kh, kw, icg), dtype=torch.uint8)


@torch.library.register_fake("qbackend::onednn_conv2d_prepack")
def _onednn_conv2d_prepack_fake(weight, w_scales, stride, padding, dilation, groups, x_shape=None, x_scale=1.0,
                                x_zero_point=0):
    return torch.empty_like(weight)


@torch.library.register_fake("qbackend::fbgemm_conv2d")
def _fbgemm_conv2d_fake(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation,
                        groups, output_scale, output_zero_point, output_dtype, post_op, accum=None,
                        accum_scale=1.0, accum_zero_point=0):
    # The fbgemm handle is shaped [OC, KH, KW, IC/groups].
    check_same_device(x, w_packed=w_packed, w_scales=w_scales, bias=bias, accum=accum)
    return _conv_out(x, w_packed.shape[0], (w_packed.shape[1], w_packed.shape[2]), stride, padding,
                     dilation, output_dtype)


@torch.library.register_fake("qbackend::onednn_conv2d")
def _onednn_conv2d_fake(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation,
                        groups, output_scale, output_zero_point, output_dtype, post_op, accum=None,
                        accum_scale=1.0, accum_zero_point=0):
    check_same_device(x, w_packed=w_packed, w_scales=w_scales, bias=bias, accum=accum)
    return _conv_out(x, w_packed.shape[0], (w_packed.shape[2], w_packed.shape[3]), stride, padding,
                     dilation, output_dtype)


@torch.library.register_fake("qbackend::native_conv2d_prepack")
def _native_conv2d_prepack_fake(weight, stride, padding, dilation, groups):
    # [kH, kW, L]: the bytes of the GEMM weight [OC, Kg] (Kg >= kH * kW * IC: native_conv_gemm_k),
    # padded to a multiple of kH * kW.
    oc, ic, kh, kw = weight.shape
    taps = kh * kw
    return weight.new_empty((kh, kw, -(-_C.native_packed_size(oc, _C.native_conv_gemm_k(ic, kh, kw)) // taps)),
                            dtype=torch.uint8)


@torch.library.register_fake("qbackend::native_conv2d")
def _native_conv2d_fake(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation,
                        groups, output_scale, output_zero_point, output_dtype, post_op, accum=None,
                        accum_scale=1.0, accum_zero_point=0):
    # The native packed weight is bytes shaped [kH, kW, L] (1-D: a 1x1 weight of earlier versions): the
    # output channels come from w_scales (one each).
    check_same_device(x, w_packed=w_packed, w_scales=w_scales, bias=bias, accum=accum)
    kernel = (w_packed.shape[0], w_packed.shape[1]) if w_packed.dim() == 3 else (1, 1)
    return _conv_out(x, w_scales.shape[0], kernel, stride, padding, dilation, output_dtype)


def _conv2d_add_fake(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
                     output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale, accum_zero_point):
    check_same_device(x, w_packed=w_packed, w_scales=w_scales, bias=bias, accum=accum)
    return None  # the result is written into accum


# The in-place residual convs share one signature and return nothing.
for _name in ops_named("conv2d_add_"):
    torch.library.register_fake(_name)(_conv2d_add_fake)
