"""Fake (meta) impls of torch.ops.qbackend.woq_linear, woq_a8_linear, woq4_linear and woq4a8_linear,
the int8 and int4 weight Linears (the a8 ones with int8 activations), so torch.compile and
torch.export trace them. The C++ ops in csrc/ops/woq_ops.cpp document them; their weights are row
tiles (qbackend.nn.weight_tiles); qbackend.nn.WeightOnlyLinear and Int4WeightOnlyLinear are their users."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


def _check_tiles(w, n, row_bytes):
    shape = (-(-n // 4), -(-row_bytes // 16), 64)
    torch._check_value(w.dim() == 3 and tuple(w.shape) == shape,
                       lambda: f"w must be the weight's row tiles {list(shape)}, got {list(w.shape)}")


@torch.library.register_fake("qbackend::woq_linear")
@torch.library.register_fake("qbackend::woq_a8_linear")
def _woq_linear_fake(x, w, scales, bias=None):
    n = scales.shape[0]
    _check_tiles(w, n, x.shape[-1])
    return x.new_empty((*x.shape[:-1], n))


@torch.library.register_fake("qbackend::woq4_linear")
@torch.library.register_fake("qbackend::woq4a8_linear")
def _woq4_linear_fake(x, w, scales, offsets, group_size, in_features, out_features, bias=None):
    torch._check_value(x.shape[-1] == in_features,
                       lambda: f"x's last dimension must be in_features {in_features}, got {x.shape[-1]}")
    _check_tiles(w, out_features, (in_features + 1) // 2)
    return x.new_empty((*x.shape[:-1], out_features))
