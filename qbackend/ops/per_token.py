"""Per-token activations: fake (meta) impls of torch.ops.qbackend.quantize_per_row and
torch.ops.qbackend.per_row_dequantize (csrc/ops/per_token_ops.cpp), the two ops around an int8
GEMM whose float input is quantized row by row at run time (qbackend.nn.TokenQuantizedLinear).
Their semantics, in fp32 bit for bit: qbackend.ops.reference.quantize_per_row and
per_row_dequantize."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)


@torch.library.register_fake("qbackend::quantize_per_row")
def _quantize_per_row_fake(x, qmax=255):
    torch._check_value(x.dim() >= 1, lambda: "quantize_per_row: x must have at least one dimension")
    torch._check_value(qmax in (255, 127), lambda: f"quantize_per_row: qmax must be 255 or 127, got {qmax}")
    lead = x.shape[:-1]
    return (torch.empty(x.shape, dtype=torch.uint8, device=x.device),
            torch.empty(lead, dtype=torch.float32, device=x.device),
            torch.empty(lead, dtype=torch.int32, device=x.device))


@torch.library.register_fake("qbackend::per_row_dequantize")
def _per_row_dequantize_fake(acc, scale, zero_point, colsum, bias=None):
    torch._check_value(acc.dim() >= 1, lambda: "per_row_dequantize: acc must have at least one dimension")
    torch._check_value(colsum.dim() == 1 and colsum.shape[0] == acc.shape[-1],
                       lambda: "per_row_dequantize: colsum must be 1-D of length acc.size(-1)")
    return torch.empty(acc.shape, dtype=torch.float32, device=acc.device)
