"""Fake (meta) impls of GPTQ's ops: torch.ops.qbackend.gptq_round_columns, the column loop (the C++ op
in csrc/ops/gptq_ops.cpp documents it; qbackend.algorithms.gptq is its user and holds its torch-op
reference, gptq_columns_ref), and torch.ops.qbackend.ordered_square, the Hessian in rounding order
(csrc/ops/ordered_square_ops.cpp; its reference is h[order[:, None], order].to(dtype))."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the op)

__all__: list[str] = []


@torch.library.register_fake("qbackend::gptq_round_columns")
def _gptq_round_columns_fake(w, l, scales, qmin, qmax, block):
    torch._check_value(w.dim() == 2, lambda: f"w must be 2-D [N, K], got {w.dim()}-D")
    return torch.empty(w.shape, dtype=torch.float32, device=w.device)


@torch.library.register_fake("qbackend::ordered_square")
def _ordered_square_fake(h, order, dtype):
    torch._check_value(h.dim() == 2 and h.shape[0] == h.shape[1], lambda: f"h must be square [K, K], got {h.shape}")
    return torch.empty(h.shape, dtype=dtype, device=h.device)
