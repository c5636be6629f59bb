"""GPTQ rounding for the decoder LLMs' 4-bit group-wise weights, from calibration token ids.

Rounding W [N, K] to Q changes a Linear's output on inputs X [rows, K] by X (W - Q)^T, whose squared
norm is tr((W - Q) H (W - Q)^T) with H = X^T X. GPTQ (Frantar et al., "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers", 2022) takes the columns in order, rounds each
to its group's grid and spreads the rounding error over the columns not yet rounded, in blocks of
columns (lazy batch updates), through M with M M^T = H + damping (qbackend.algorithms.gptq states
the update and its equivalence to the (H + damping)^-1 form). Each group's grid
(scale and offset, as `quantize_int4` defines them for the symmetric and asymmetric forms) is set
from the group's weights as they stand when its first column comes up, so it covers the errors
already spread into it (the reference implementation's "groupsize" mode; no activation order).

* `record_hessians(model, names, calibration)`: H for the inputs of the named Linears, from a
  forward of the float model on every calibration batch (rows with NaN or inf skipped), read by
  `hessians_of`.
* `gptq_int4(weight, hessian, group_size, symmetric)`: (packed, scales, offsets) as `quantize_int4`
  returns them; nearest rounding (quantize_int4) where its proxy error tr((W - Q) H (W - Q)^T) is not
  higher, or where H is unusable.

One shot: every H comes from the float model (no layer sees its predecessors' rounding). H is fp64
K x K per Linear input while recorded (qbackend.algorithms.gptq.HessianStats), read as fp32:
2.7 MB at K = 576, 19 MB at K = 1536, 134 MB at K = 4096.

The rounding fits the calibration text's statistics: on SmolLM2-135M with 4-bit groups of 128 and
1536 tokens of Python's pydoc topics, perplexity on held-out pydoc text went 33.5 -> 31.6 (FP32 23.4)
but on an English novel's opening 49.6 -> 64.7 (FP32 31.5); more damping (0.1, 1.0) did not keep the
second. Calibrate on text like the model's use.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..algorithms.gptq import HessianStats, proxy_errors, upper_cholesky
from ..nn.int4_linear import dequantize_int4, group_grid, quantize_int4

__all__ = ["record_hessians", "hessians_of", "gptq_int4", "calibration_batches"]

BLOCK = 128


def calibration_batches(calibration, allow_empty: bool = False) -> list[torch.Tensor]:
    """The calibration token ids as a list of int64 [batch, length] tensors: one tensor [B, L] or
    [L], or an iterable of them (empty only with `allow_empty`: a rank of a distributed
    calibration with no shard)."""
    items = [calibration] if isinstance(calibration, torch.Tensor) else list(calibration)
    if not items and not allow_empty:
        raise ValueError("calibration must hold at least one batch of token ids")
    out = []
    for i, ids in enumerate(items):
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32) or \
                ids.dim() not in (1, 2) or ids.numel() == 0:
            raise ValueError(f"calibration batch {i} must be a non-empty int64 tensor of token ids [batch, length] "
                             f"or [length], got {type(ids).__name__} "
                             f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else ''}")
        out.append(ids.long().reshape(1, -1) if ids.dim() == 1 else ids.long())
    return out


def record_hessians(model: nn.Module, names: Iterable[str], calibration: list[torch.Tensor]) -> dict:
    """{name: HessianStats} recording the inputs of the named Linears of `model` over a forward of
    every calibration batch (the model as it is: call before any Linear is replaced)."""
    stats = {name: HessianStats(name) for name in names}
    handles = [model.get_submodule(name).register_forward_pre_hook(
        lambda m, args, stat=stat: stat(args[0]) if args else None) for name, stat in stats.items()]
    try:
        with torch.no_grad():
            for ids in calibration:
                model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return stats


def hessians_of(stats: dict) -> dict:
    """{name: (H fp32, rows)} of recorded HessianStats, those that saw rows."""
    return {name: (stat.hessian, stat.rows) for name, stat in stats.items() if stat.hessian is not None}


def _grid(w: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, offset) [N] of a group of columns w [N, g]: quantize_int4's grid (float16 values, as float32)."""
    scale, offset = group_grid(w.amin(dim=1), w.amax(dim=1), symmetric)
    return scale.float(), offset.float()


def _levels(w: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Each weight's nearest level u in [0, 15] of the grid scale * u + offset (symmetric grids have
    offset -8 scale, so u = level + 8 as quantize_int4 stores it)."""
    return torch.clamp(torch.round((w - offset) / scale), 0, 15)


def _pack(levels: torch.Tensor) -> torch.Tensor:
    u = levels.to(torch.uint8)
    if u.shape[1] % 2:
        u = nn.functional.pad(u, (0, 1))
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()


def gptq_int4(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool):
    """((packed uint8 [N, ceil(K / 2)], scales [N, G], offsets [N, G]), whether GPTQ's rounding was
    kept) for the float weight [N, K]: GPTQ's rounding for the input statistics H [K, K] (see the
    module docstring), or quantize_int4's nearest rounding where that is not worse."""
    nearest = quantize_int4(weight, group_size, symmetric)
    w0 = weight.detach().float()
    n, k = w0.shape
    dead = torch.diagonal(hessian) <= 0  # inputs never seen: no coupling (upper_cholesky)
    if bool(dead.all()):
        return nearest, False
    m = upper_cholesky(hessian)
    if m is None:
        return nearest, False
    w = w0.clone()
    w[:, dead] = 0.0
    groups = -(-k // group_size)
    scales, offsets = torch.empty(n, groups), torch.empty(n, groups)
    levels = torch.empty(n, k)
    diag = torch.diagonal(m)
    acc = torch.zeros(n, k)  # column j is rounded from w_j + acc_j / M_jj
    block = max(BLOCK, group_size)  # a multiple of every group size: a group never spans two blocks
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        d = torch.empty(n, b1 - b0)
        for i in range(b1 - b0):
            col = b0 + i
            g = col // group_size
            if col % group_size == 0:
                end = min(col + group_size, k)
                scales[:, g], offsets[:, g] = _grid(w[:, col:end] + acc[:, col:end] / diag[col:end], symmetric)
            q = _levels(w[:, col] + acc[:, col] / diag[col], scales[:, g], offsets[:, g])
            levels[:, col] = q
            d[:, i] = w[:, col] - (q * scales[:, g] + offsets[:, g])
            acc[:, col + 1:b1] += d[:, i:i + 1] * m[col, col + 1:b1][None, :]
        if b1 < k:
            acc[:, b1:] += d @ m[b0:b1, b1:]
    packed = _pack(levels)
    h_used = hessian.float()
    gptq_error, nearest_error = proxy_errors(w0, [dequantize_int4(packed, scales, offsets, group_size, k),
                                                  dequantize_int4(*nearest, group_size, k)], h_used)
    if not gptq_error < nearest_error:
        return nearest, False
    return (packed, scales.to(torch.float16), offsets.to(torch.float16)), True
