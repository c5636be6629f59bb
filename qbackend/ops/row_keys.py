"""The fake (meta) impl of torch.ops.qbackend.row_keys (csrc/ops/row_keys_ops.cpp): a 64-bit key per
row of a float32 [R, C] tensor, a function of the row's bits alone, for the exactly mergeable row
samples of qbackend.algorithms.smoothquant.ChannelStats. Its semantics: reference.row_keys."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)


@torch.library.register_fake("qbackend::row_keys")
def _row_keys_fake(rows, multipliers):
    torch._check_value(rows.dim() == 2, lambda: f"row_keys: rows must be 2-D [R, C], got {rows.dim()} dimensions")
    torch._check_value(multipliers.dim() == 1 and multipliers.shape[0] == rows.shape[1],
                       lambda: "row_keys: multipliers must be 1-D of length rows.size(1)")
    return torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
