"""Fake (meta) impl of torch.ops.qbackend.gptq_round_columns, GPTQ's column loop (the C++ op in
csrc/ops/gptq_ops.cpp documents it; qbackend.algorithms.gptq is its user and holds its torch-op
reference, gptq_columns_ref)."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::gptq_round_columns")
def _gptq_round_columns_fake(w, l, scales, qmin, qmax, block):
    torch._check_value(w.dim() == 2, lambda: f"w must be 2-D [N, K], got {w.dim()}-D")
    return torch.empty(w.shape, dtype=torch.float32, device=w.device)
