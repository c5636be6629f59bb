"""Linear ops: fake (meta) impls of torch.ops.qbackend.{fbgemm,onednn,native}_linear[_prepack|_dynamic].

The C++ kernels (csrc/providers/fbgemm_linear.cpp, onednn_linear.cpp, native_linear.cpp) register the ops when the
extension loads; the fake impls here give torch.compile / torch.export their output shapes.
Semantics: qbackend.ops.reference.linear. Users call them through PackedLinearWeight.
"""
from __future__ import annotations

import torch

from ..core.extension import _C
from .library import ops_named


def check_same_device(x, **tensors):
    """A meta tensor among CPU ones sends the call here (the Meta kernel): refuse the mix rather than
    return an uninitialised CPU tensor. Names the first argument not on x's device."""
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on device {t.device} but x is on device {x.device}: "
                             "all tensor arguments must be on one device (CPU)")


def _linear_out(x, w_scales, dtype, w_packed, bias):
    check_same_device(x, w_packed=w_packed, w_scales=w_scales, bias=bias)
    torch._check_value(x.dim() >= 1, lambda: "x must have at least 1 dimension")
    return x.new_empty((*x.shape[:-1], w_scales.shape[0]), dtype=dtype)


@torch.library.register_fake("qbackend::fbgemm_linear_prepack")
def _fbgemm_linear_prepack_fake(weight):
    n, k = weight.shape
    return weight.new_empty((_C.fbgemm_packed_b_size(k, n),), dtype=torch.uint8)


@torch.library.register_fake("qbackend::onednn_linear_prepack")
def _onednn_linear_prepack_fake(weight, x_shape=None):
    return weight.new_empty((weight.shape[1], weight.shape[0]), dtype=torch.int8)


@torch.library.register_fake("qbackend::native_linear_prepack")
def _native_linear_prepack_fake(weight):
    n, k = weight.shape
    return weight.new_empty((_C.native_packed_size(n, k),), dtype=torch.uint8)


def _linear_fake(x, x_scale, x_zero_point, w_packed, w_scales, bias, output_scale, output_zero_point, output_dtype,
                 post_op):
    return _linear_out(x, w_scales, output_dtype, w_packed, bias)


def _linear_dynamic_fake(x, w_packed, w_scales, bias, reduce_range, post_op):
    return _linear_out(x, w_scales, torch.float32, w_packed, bias)


# Every provider's linear ops share one signature and one output shape (N from w_scales).
for _name in ops_named("linear"):
    torch.library.register_fake(_name)(_linear_fake)
for _name in ops_named("linear_dynamic"):
    torch.library.register_fake(_name)(_linear_dynamic_fake)
