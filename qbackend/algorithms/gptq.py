"""GPTQ weight rounding for static Linears: choose each int8 weight so that the layer's OUTPUT error
on the calibration data is small, instead of rounding every weight to its nearest level.

Rounding W [N, K] to Q on a fixed per-output-channel grid (the scales the config's weight observer
chose; only which level each weight takes changes) changes the output on inputs X [rows, K] by
X (W - Q)^T, whose squared norm is the trace of (W - Q) H (W - Q)^T with H = X^T X. GPTQ (Frantar
et al., 2022) quantizes the columns one at a time, in order of decreasing H diagonal (the inputs
with the most energy first), and spreads each column's rounding error over the columns not yet
quantized through the upper Cholesky factor of H^-1, processed in blocks of 128 columns. On
BERT-base it cuts the weight-induced output error by about 10 dB against nearest rounding
(benchmarks/results/design_measurements.md, "GPTQ on BERT-base").

* calibration: `HessianStats` beside each Linear input value accumulates H = sum of x x^T over its
  rows (fp32, K x K per input value: 36 MB for BERT-base's 3072-wide FFN input; rows with NaN or
  inf skipped);
* convert: `gptq_round` returns the int8 weight for the layer's scales (the column loop in C++:
  qbackend::gptq_round_columns, whose torch-op reference is `gptq_columns_ref`); it keeps nearest rounding
  when its proxy error tr((W - Q) H (W - Q)^T) is not lower (measured on up to 256 output
  channels, sampled) and when H is unusable (no rows).

Settings: QuantConfig.weight_rounding ("gptq", the default, or "nearest"), per layer; Linears with
more than `MAX_FEATURES` input features keep nearest rounding (H is K x K).
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops import gptq_ops  # noqa: F401  (registers qbackend::gptq_round_columns)

MAX_FEATURES = 8192  # H in fp32: 256 MB at this size
BLOCK = 128
DAMP = 0.01  # times the mean of H's diagonal, added to the diagonal


class HessianStats(nn.Module):
    """A graph node accumulating H = sum x x^T over the rows of a value [..., K] (fp32)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.hessian: torch.Tensor | None = None
        self.rows = 0

    def forward(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
            return
        rows = x.detach().reshape(-1, x.shape[-1])
        finite = torch.isfinite(rows).all(dim=1)
        if not bool(finite.all()):
            rows = rows[finite]
        if rows.shape[0] == 0:
            return
        rows = rows.float()
        if self.hessian is None:
            self.hessian = torch.zeros(rows.shape[1], rows.shape[1])
        self.hessian.addmm_(rows.t(), rows)
        self.rows += rows.shape[0]

    def extra_repr(self) -> str:
        return f"{self.name}: {self.rows} rows"


PROXY_ROWS = 256  # output channels the proxy error is measured on (all of them up to this many)


def proxy_error(w: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, h: torch.Tensor,
                rows: torch.Tensor | None = None) -> float:
    """tr((W - Q s) H (W - Q s)^T): the output error power of the rounding on the calibration rows
    (fp32 products, summed in fp64), over the output channels `rows` (all if None)."""
    if rows is not None:
        w, q, scales = w[rows], q[rows], scales[rows]
    e = w.float() - q.float() * scales.float()[:, None]
    return float(((e @ h.float()) * e).double().sum())


def inverse_cholesky(h: torch.Tensor) -> torch.Tensor | None:
    """The upper Cholesky factor U of (H + damping)^-1 (U^T U = (H + damping)^-1) in fp32 (fp64 if
    fp32 is not enough), the damping raised until H is positive definite; None if it never is.

    One Cholesky and one triangular inverse: with J the order reversal and J H J = L L^T,
    H^-1 = (J L^-1 J)^T (J L^-1 J) and J L^-1 J is upper triangular."""
    k = h.shape[0]
    mean = max(float(torch.diagonal(h).mean()), 1e-12)
    flipped = h.flip(0, 1)
    for dtype in (torch.float32, torch.float64):
        for damp in (DAMP, 0.1, 1.0):
            hd = (flipped + damp * mean * torch.eye(k, dtype=h.dtype)).to(dtype)
            lower, info = torch.linalg.cholesky_ex(hd)
            if int(info) == 0:
                eye = torch.eye(k, dtype=dtype)
                upper = torch.linalg.solve_triangular(lower, eye, upper=False).flip(0, 1)
                if bool(torch.isfinite(upper).all()):
                    return upper.float()
    return None


def factor(hessian: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(column order, upper Cholesky factor of the reordered (H + damping)^-1): what GPTQ needs of
    H, shared by every Linear reading the same input; None when H has no energy or no factor."""
    h = hessian.float().clone()
    diag = torch.diagonal(h)
    dead = diag <= 0
    if bool(dead.all()):
        return None
    diag[dead] = 1.0  # inputs never seen: no coupling, nearest rounding for those columns
    perm = torch.argsort(torch.diagonal(h), descending=True)
    u = inverse_cholesky(h[perm][:, perm])
    return None if u is None else (perm, u)


def gptq_columns_ref(w: torch.Tensor, u: torch.Tensor, scales: torch.Tensor, qmin: int, qmax: int,
                     block: int = BLOCK) -> torch.Tensor:
    """GPTQ's column loop in torch ops, the reference of the C++ op qbackend::gptq_round_columns
    (csrc/ops/gptq_ops.cpp, which agrees with it bit for bit): float levels [N, K] for the weight w
    [N, K] in GPTQ's column order, u the upper Cholesky factor of that order's (H + damping)^-1,
    scales [N]."""
    n, k = w.shape
    wp = w.float().clone()
    sp = scales.float().reshape(n, 1)
    q = torch.empty_like(wp)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = wp[:, i1:i2].clone()
        err = torch.empty_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = w1[:, i]
            qc = torch.clamp(torch.round(col / sp[:, 0]), qmin, qmax)
            q[:, i1 + i] = qc
            e = (col - qc * sp[:, 0]) / u1[i, i]
            w1[:, i:].sub_(e[:, None] * u1[i, i:][None, :])
            err[:, i] = e
        if i2 < k:
            wp[:, i2:].sub_(err @ u[i1:i2, i2:])
    return q


def gptq_round(weight: torch.Tensor, scales: torch.Tensor, hessian: torch.Tensor, qmin: int, qmax: int,
               nearest: torch.Tensor | None = None, factored=None) -> tuple[torch.Tensor, dict]:
    """(int8 Q [N, K] on the grid q * scales[n], info) for the float weight [N, K] and H [K, K];
    `nearest`: the nearest-rounding Q, returned instead when GPTQ's proxy error is not lower;
    `factored`: factor(hessian), if already computed."""
    w = weight.detach().float()
    n, k = w.shape
    s = scales.float().reshape(-1, 1)
    if nearest is None:
        nearest = torch.clamp(torch.round(w.double() / s.double()), qmin, qmax).to(torch.int8)
    f = factored if factored is not None else factor(hessian)
    if f is None:
        return nearest, {"method": "nearest", "why": "no usable calibration Hessian"}
    perm, u = f
    q = torch.ops.qbackend.gptq_round_columns(w[:, perm].contiguous(), u.contiguous(), s.reshape(-1).contiguous(),
                                              qmin, qmax, BLOCK)
    q = q[:, torch.argsort(perm)].to(torch.int8)
    rows = None if n <= PROXY_ROWS else torch.randperm(n, generator=torch.Generator().manual_seed(0))[:PROXY_ROWS]
    before = proxy_error(w, nearest, scales, hessian, rows)
    after = proxy_error(w, q, scales, hessian, rows)
    info = {"method": "gptq", "proxy_error_nearest": before, "proxy_error": after}
    if not after < before:
        return nearest, {**info, "method": "nearest", "why": "GPTQ did not lower the proxy error"}
    return q.contiguous(), info
