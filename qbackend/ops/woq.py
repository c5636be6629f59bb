"""Fake (meta) impls of torch.ops.qbackend.woq_linear, woq_a8_linear, woq4_linear and woq4a8_linear,
the int8 and int4 weight Linears (the a8 ones with int8 activations) (the C++ ops in csrc/ops/woq_ops.cpp document them; qbackend.nn.WeightOnlyLinear and
Int4WeightOnlyLinear are their users), so torch.compile and torch.export trace them."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::woq_linear")
@torch.library.register_fake("qbackend::woq_a8_linear")
def _woq_linear_fake(x, w, scales, bias=None):
    torch._check_value(w.dim() == 2, lambda: f"w must be 2-D [N, K], got {w.dim()}-D")
    torch._check_value(x.shape[-1] == w.shape[1],
                       lambda: f"x's last dimension must be the weight's in_features {w.shape[1]}, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.register_fake("qbackend::woq4_linear")
@torch.library.register_fake("qbackend::woq4a8_linear")
def _woq4_linear_fake(x, w, scales, offsets, group_size, in_features, bias=None):
    torch._check_value(w.dim() == 2, lambda: f"w must be 2-D [N, ceil(in_features / 2)], got {w.dim()}-D")
    torch._check_value(x.shape[-1] == in_features,
                       lambda: f"x's last dimension must be in_features {in_features}, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], w.shape[0]))
