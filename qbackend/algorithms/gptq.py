"""GPTQ weight rounding for static Linears and convs: choose each int8 weight so that the layer's
OUTPUT error on the calibration data is small, instead of rounding every weight to its nearest
level; and bias correction, which takes the mean output shift the rounding leaves off the bias.

Rounding W [N, K] to Q on a fixed per-output-channel grid (the scales the config's weight observer
chose; only which level each weight takes changes) changes the output on inputs X [rows, K] by
X (W - Q)^T, whose squared norm is the trace of (W - Q) H (W - Q)^T with H = X^T X. GPTQ (Frantar
et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers", 2022)
quantizes the columns one at a time, in order of decreasing H diagonal (the inputs with the most
energy first), and spreads each column's rounding error over the columns not yet quantized, in
blocks of 128 columns. On BERT-base it cuts the weight-induced output error by about 10 dB against
nearest rounding (benchmarks/results/design_measurements.md, "GPTQ on BERT-base").

The error spreading needs no inverse of H. GPTQ's update through the upper Cholesky factor U of
H^-1 (U^T U = H^-1) is, written with M = U^-1 (upper triangular, M M^T = H), column j rounded from

    y_j = w_j + sum_{i < j} (w_i - q_i s) M_ij / M_jj

(Chen et al., "The Geometry of LLM Quantization: GPTQ as Babai's Nearest Plane Algorithm", 2025,
show the same equivalence): the same levels as the H^-1 form in exact arithmetic, for one K^3/3
factorization instead of a factorization and a triangular inverse. With the columns in reversed
order M is the plain lower Cholesky factor L of H (L L^T = H, M = J L J for the reversal J): the
loop takes the weight's columns in the reversed rounding order and L as the factorization gives
it, and rounds from the last column to the first (no flip of the K x K factor).

A conv is a Linear over its im2col rows: each output position's receptive field, K = C/groups x
KH x KW columns in the order of weight.reshape(OC, -1) (channel, then kernel row, then column).
A grouped conv has one H per group ([G, K, K]); a depthwise conv (one output channel per group)
is rounded per channel by a batched torch loop over its few columns (`_rounded_per_channel`).

Bias correction (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", 2019, section 4.2, with the input mean measured on the calibration data rather than
derived from BatchNorm statistics): the rounded layer's expected output on the calibration rows
differs from the float one by (Q s - W) E[x]; `corrected_bias` takes it off the bias, so the
layer's mean output is the float layer's.

* calibration: `HessianStats` beside each Linear / conv input value accumulates H = sum of x x^T
  over its rows (each batch's products in fp32, summed over batches in fp64 and read as fp32; K x K
  per input value and conv geometry: 72 MB for BERT-base's 3072-wide FFN input) and the column sums
  (fp64); rows with NaN or inf skipped (a conv skips the images with
  any where it reads them); a conv records H only where `conv_takes_gptq`, and takes its im2col
  rows into H on a sub-grid of its output positions where a batch has more than
  SAMPLED_ROWS_PER_FEATURE per column;
* convert: `round_weight` returns the int8 weight for the layer's scales (the column loop in
  C++: qbackend::gptq_round_columns, whose torch-op reference is `gptq_columns_ref`; the factor L
  from `factor`, shared by the layers reading one input); it keeps
  nearest rounding when its proxy error tr((W - Q) H (W - Q)^T) is not lower (measured on up to
  PROXY_ROWS output channels, sampled; per channel for depthwise convs) and when H is unusable (no rows).

Settings: QuantConfig.weight_rounding ("gptq", the default, or "nearest") and
QuantConfig.bias_correction, per layer; layers with more than `MAX_FEATURES` input features (per
group) keep nearest rounding (H is K x K).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..ops import conv_stats, gptq_ops  # noqa: F401  (register qbackend::im2col_column_sums, gptq_round_columns)
from .sampling import sampled_rows

MAX_FEATURES = 8192  # H at this size: 512 MB of fp64 sums, read as 256 MB of fp32
ROWS_PER_FEATURE = 2  # a conv takes GPTQ where one example batch gives this many im2col rows per column
SAMPLED_ROWS_PER_FEATURE = 2  # H takes at most this many of a batch's im2col rows per column (every r-th)
MIN_SAMPLED_ROWS = 1024
BLOCK = 128
DAMP = 0.01  # times the mean of H's diagonal, added to the diagonal


def _output_size(h: int, w: int, conv: dict) -> tuple[int, int]:
    """A conv's output height and width for an input of h x w."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv["kernel"], conv["stride"], conv["padding"], conv["dilation"]
    return (max((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, 0), max((w + 2 * pw - dw * (kw - 1) - 1) // sw + 1, 0))


def conv_rows(x_shape, conv: dict) -> int:
    """The im2col rows (output positions) a conv makes of an input of shape [N, C, H, W]."""
    oh, ow = _output_size(x_shape[2], x_shape[3], conv)
    return x_shape[0] * oh * ow


def conv_takes_gptq(x_shape, conv: dict, features: int) -> bool:
    """Whether a conv's H is worth recording: its example batch gives at least ROWS_PER_FEATURE
    im2col rows per column (`features`, per group). Deep convs with few output positions and many
    columns (ResNets' last stages) get an H that their calibration rows do not determine, and cost
    the most to accumulate and factor (benchmarks/results/epyc_zen4/accuracy_sources.md, section 3)."""
    return conv_rows(x_shape, conv) >= ROWS_PER_FEATURE * features


class HessianStats(nn.Module):
    """A graph node accumulating, over the rows of a value, H = sum x x^T (None without
    `second_moment`: bias correction alone needs only the mean) and the column sums (fp64).

    The rows: a Linear input [..., K] as is; a conv input [N, C, H, W] through the conv's im2col
    (`conv`: its "kernel", "stride", "padding", "dilation" and "groups"), then H is [G, K, K] for a
    conv of G > 1 groups (K = C / G x KH x KW).

    Each call's products are formed in fp32 and added into an fp64 sum (`products`), which
    `hessian` reads as fp32. A batch's products depend on that batch alone, and fp64 adds the
    batches' fp32 products exactly unless one entry's addends span more than about 2^29 in
    magnitude, so H is the same whatever the order or the split of the batches (the property
    the distributed reduction relies on: qbackend.distributed)."""

    def __init__(self, name: str, conv: dict | None = None, second_moment: bool = True):
        super().__init__()
        self.name = name
        self.conv = None if conv is None else {k: (tuple(v) if isinstance(v, (list, tuple)) else v)
                                               for k, v in conv.items()}
        self.second_moment = second_moment
        self.products: torch.Tensor | None = None  # the fp64 sum; its upper blocks stale after an add (`hessian`)
        self._symmetric = True
        self._read: torch.Tensor | None = None  # `hessian` as last read, until the next add
        self.column_sum: torch.Tensor | None = None
        self.rows = 0

    @property
    def hessian(self) -> torch.Tensor | None:
        """H in fp32 (None before any rows): the block upper triangle copied from the lower one,
        which is all that `_add_products` accumulates for a wide 2-D H."""
        h = self.products
        if h is None:
            return None
        if not self._symmetric:
            b = _triangle_block(h.shape[0])
            for i in range(b, h.shape[0], b):
                h[:i, i:i + b] = h[i:i + b, :i].t()
            self._symmetric = True
        if self._read is None:
            self._read = h.float()
        return self._read

    def set_sums(self, rows: int, column_sum: torch.Tensor | None, products: torch.Tensor | None) -> None:
        """Replace the statistics (the distributed reduction's result): `products` the fp64 sum
        in full (both triangles)."""
        self.rows, self.column_sum, self.products = int(rows), column_sum, products
        self._symmetric, self._read = True, None

    def forward(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
            return
        x = x.detach()
        if self.conv is None:
            rows = x.reshape(-1, x.shape[-1]).float()
            column_sum = rows.sum(0, dtype=torch.float64)  # finite exactly when every value is (fp64 cannot overflow)
            if not bool(torch.isfinite(column_sum).all()):
                rows = rows[torch.isfinite(rows).all(dim=1)]
                column_sum = rows.sum(0, dtype=torch.float64)
            count = rows.shape[0]
        else:
            if x.dim() != 4:
                return
            x = x.float()
            sums = _im2col_column_sums(x, self.conv)  # an image with a NaN or inf that the conv reads has one here
            finite = torch.isfinite(sums).all(dim=1)
            if not bool(finite.all()):
                x, sums = x[finite], sums[finite]
            count, column_sum = conv_rows(x.shape, self.conv), sums.sum(0, dtype=torch.float64)
            rows = _sampled_im2col(x, self.conv) if self.second_moment else None
        if count == 0:
            return
        self.column_sum = column_sum if self.column_sum is None else self.column_sum + column_sum
        self.rows += count
        if self.second_moment:
            self._add_products(rows)

    def _add_products(self, rows: torch.Tensor) -> None:
        k = rows.shape[1]
        groups = 1 if self.conv is None else self.conv["groups"]
        self._read = None
        if groups == 1:
            if self.products is None:
                self.products = torch.zeros(k, k, dtype=torch.float64)
            h, b = self.products, _triangle_block(k)
            scratch = torch.empty(k, b)  # b <= k
            # the lower block triangle only (half the products of a wide H): column block
            # [i, i + b) from row i down
            for i in range(0, k, b):
                part = scratch[:k - i, :min(b, k - i)]
                torch.mm(rows[:, i:].t(), rows[:, i:i + b], out=part)
                h[i:, i:i + b] += part
            self._symmetric = b >= k
        else:
            per = rows.reshape(rows.shape[0], groups, k // groups).transpose(0, 1)  # [G, rows, K/G]
            if self.products is None:
                self.products = torch.zeros(groups, k // groups, k // groups, dtype=torch.float64)
            self.products += torch.bmm(per.transpose(1, 2), per)

    def mean(self) -> torch.Tensor | None:
        """E[x] per column over the rows seen (fp64), None before any."""
        return None if self.column_sum is None or self.rows == 0 else self.column_sum / self.rows

    def extra_repr(self) -> str:
        return f"{self.name}: {self.rows} rows"


def _triangle_block(k: int) -> int:
    """The column blocks a 2-D H of K columns accumulates in: the whole H below 512 columns (one
    product), else at most 8 blocks of at least 192 columns: fp32 products of 1024 rows measured
    1.2x (K = 768) to 1.9x (K = 3072) faster than the full product on Zen 4, 2 threads."""
    return k if k < 512 else max(192, -(-k // 8))


PROXY_ROWS = 128  # output channels the proxy errors are measured on (all of them up to this many)


def proxy_errors(w: torch.Tensor, approximations: list[torch.Tensor], h: torch.Tensor) -> list[float]:
    """tr((W - A) H (W - A)^T) for each float approximation A of the weight W [N, K] (a rounding
    on its grid, dequantized): the output error power of each on the calibration rows (fp32
    products in one matmul, summed in fp64)."""
    e = torch.cat([w.float() - a.float() for a in approximations])
    per_row = ((e @ h.float()) * e).double().sum(1)
    return [float(part.sum()) for part in per_row.split(w.shape[0])]


def _im2col_column_sums(x: torch.Tensor, conv: dict) -> torch.Tensor:
    """Per image, the sums of a conv's im2col columns over its output positions ([N, C x KH x KW]
    float32, the order of weight.reshape(OC, -1)) without forming them: the C++ op
    qbackend::im2col_column_sums (one pass over each image plane, fp64 sums)."""
    return torch.ops.qbackend.im2col_column_sums(x.float(), list(conv["kernel"]), list(conv["stride"]),
                                                  list(conv["padding"]), list(conv["dilation"]))


def _sampled_im2col(x: torch.Tensor, conv: dict) -> torch.Tensor:
    """A conv's im2col rows of x [rows, C x KH x KW] (F.unfold's rows, in its order) at every
    step-th output position in each direction, step the smallest that leaves at most
    max(SAMPLED_ROWS_PER_FEATURE x K, MIN_SAMPLED_ROWS) rows (K per group): the C++ op
    qbackend::sampled_im2col, which forms only the rows taken (zeros where a tap reads the padding)
    and reads a channels-last x in place."""
    n, c = x.shape[0], x.shape[1]
    kh, kw = conv["kernel"]
    features = c // conv["groups"] * kh * kw
    cap = max(SAMPLED_ROWS_PER_FEATURE * features, MIN_SAMPLED_ROWS)
    oh, ow = _output_size(x.shape[2], x.shape[3], conv)
    step = 1
    while n * -(-oh // step) * -(-ow // step) > cap and step < max(oh, ow):
        step += 1
    return torch.ops.qbackend.sampled_im2col(x.float(), list(conv["kernel"]), list(conv["stride"]),
                                             list(conv["padding"]), list(conv["dilation"]), step)


def _ordered(h: torch.Tensor, order: torch.Tensor | None, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(H' as a new `dtype` tensor, H' = H with its columns and rows in `order` (as they are if None)
    and columns never seen (H_cc <= 0) given H_cc = 1; the mean of that diagonal, at least 1e-12)."""
    base = h.to(dtype, copy=True) if order is None else torch.ops.qbackend.ordered_square(h, order, dtype)
    diag = torch.diagonal(base)
    diag.masked_fill_(diag <= 0, 1.0)
    return base, max(float(diag.mean()), 1e-12)


CHOLESKY_BLOCK = 256  # columns per diagonal block of `_cholesky`


def _cholesky(a: torch.Tensor) -> torch.Tensor | None:
    """The lower Cholesky factor L of the symmetric a [K, K] (L L^T = a), None where a is not
    positive definite. Above 2 x CHOLESKY_BLOCK columns a is overwritten with L, blocked right-
    looking: LAPACK's factorization of each diagonal block, a triangular solve for the panel
    below it, the trailing lower triangle updated panel by panel with matrix products (the bulk
    of the work): 2x LAPACK's one call on 3072 columns (fp32, 2 threads: 0.075 against 0.149 s on
    the AMX Xeon), and no K x K buffer besides a's."""
    k, nb = a.shape[0], CHOLESKY_BLOCK
    if k <= 2 * nb:
        lower, info = torch.linalg.cholesky_ex(a)
        return lower if int(info) == 0 else None
    for j in range(0, k, nb):
        e = min(j + nb, k)
        ljj, info = torch.linalg.cholesky_ex(a[j:e, j:e])
        if int(info) != 0:
            return None
        a[j:e, j:e] = ljj
        if e < k:
            panel = torch.linalg.solve_triangular(ljj.mT, a[e:, j:e], upper=True, left=False)  # A L_jj^-T
            a[e:, j:e] = panel
            for c in range(e, k, nb):
                ce = min(c + nb, k)
                a[c:, c:ce].addmm_(panel[c - e:], panel[c - e:ce - e].mT, alpha=-1)
    return a.tril_()


def lower_cholesky(h: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor | None:
    """The lower triangular L with L L^T = H' + damping, H' = H with its columns and rows in `order`
    (as they are if None) and columns never seen (H_cc <= 0) given H_cc = 1 (no coupling: nearest
    rounding for them); in fp32 (fp64 if fp32 is not enough), the damping raised until H' is
    positive definite; None if it never is. The damping goes onto the gathered H' in place, which
    `_cholesky` overwrites with L: one K x K buffer."""
    for dtype in (torch.float32, torch.float64):
        for damp in (DAMP, 0.1, 1.0):
            hd, mean = _ordered(h, order, dtype)
            torch.diagonal(hd).add_(damp * mean)
            lower = _cholesky(hd)
            if lower is not None and bool(torch.isfinite(torch.diagonal(lower)).all()):
                return lower.float()
    return None


def upper_cholesky(h: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor | None:
    """The upper triangular M with M M^T = H' + damping (H' and the damping as `lower_cholesky`'s):
    with J the order reversal and J H' J = L L^T, M = J L J."""
    k = h.shape[0]
    reverse = torch.arange(k - 1, -1, -1) if order is None else order.flip(0)
    lower = lower_cholesky(h, reverse)
    return None if lower is None else lower.flip(0, 1)


def factor(hessian: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(column order, lower triangular L with L L^T = the reordered H + damping): what GPTQ needs
    of H, shared by every Linear reading the same input; None when H has no energy or no factor.
    The order is GPTQ's rounding order reversed (the loop rounds the last column first): GPTQ
    rounds by decreasing H diagonal, columns never seen (H_cc <= 0) ranked as H_cc = 1."""
    diag = torch.diagonal(hessian).float()
    dead = diag <= 0
    if bool(dead.all()):
        return None
    order = torch.argsort(torch.where(dead, 1.0, diag), descending=True).flip(0)
    lower = lower_cholesky(hessian, order)
    return None if lower is None else (order, lower)


def gptq_columns_ref(w: torch.Tensor, l: torch.Tensor, scales: torch.Tensor, qmin: int, qmax: int,
                     block: int = BLOCK) -> torch.Tensor:
    """GPTQ's column loop in torch ops, the reference of the C++ op qbackend::gptq_round_columns
    (csrc/ops/gptq_ops.cpp, which agrees with it bit for bit): float levels [N, K] for the weight w
    [N, K] with its columns in GPTQ's order reversed, l the lower triangular factor of that order's
    H + damping (L L^T), scales [N]. Column j, from the last to the first, is rounded from
    w_j + acc_j / L_jj, acc_j = sum over the columns i > j of (w_i - q_i s) L_ij: within a block (of
    `block` columns from the last) as each column is rounded, into the earlier blocks once per
    block (ACC[:, earlier] += D @ L[block, earlier], one addmm_)."""
    n, k = w.shape
    w = w.float()
    s = scales.float().reshape(n)
    acc = torch.zeros(n, k)
    q = torch.empty(n, k)
    i2 = k
    while i2 > 0:
        i1 = max(0, i2 - block)
        d = torch.empty(n, i2 - i1)
        for i in range(i2 - i1 - 1, -1, -1):
            c = i1 + i
            y = w[:, c] + acc[:, c] / l[c, c]
            qc = torch.clamp(torch.round(y / s), qmin, qmax)
            q[:, c] = qc
            dc = w[:, c] - qc * s
            d[:, i] = dc
            acc[:, i1:c] += dc[:, None] * l[c, i1:c][None, :]
        if i1 > 0:
            acc[:, :i1].addmm_(d, l[i1:i2, :i1])
        i2 = i1
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
    order, lower = f
    q = torch.ops.qbackend.gptq_round_columns(w.index_select(1, order), lower, s.reshape(-1).contiguous(),
                                              qmin, qmax, BLOCK)
    q = q.index_select(1, torch.argsort(order)).to(torch.int8)
    rows = sampled_rows(n, PROXY_ROWS)
    ws, q0, q1, ss = (w, nearest, q, s) if rows is None else (w[rows], nearest[rows], q[rows], s[rows])
    before, after = proxy_errors(ws, [q0.float() * ss, q1.float() * ss], hessian)
    info = {"method": "gptq", "proxy_error_nearest": before, "proxy_error": after}
    if not after < before:
        return nearest, {**info, "method": "nearest", "why": "GPTQ did not lower the proxy error"}
    return q.contiguous(), info


def _rounded_per_channel(w: torch.Tensor, scales: torch.Tensor, h: torch.Tensor, qmin: int, qmax: int,
                         nearest: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """GPTQ for a depthwise conv: each output channel n has its own few columns and H [n] (h:
    [N, K, K]); the column loop runs over all channels at once (fp64), in the columns' own order.
    A channel keeps nearest rounding where GPTQ's proxy error is not lower on its own H."""
    w, h = w.double(), h.double()
    n, k = w.shape
    s = scales.double()
    diag = torch.diagonal(h, dim1=1, dim2=2)
    eye = torch.eye(k, dtype=torch.float64)
    hd = h + (DAMP * diag.mean(1).clamp_min(1e-12))[:, None, None] * eye
    lower, info = torch.linalg.cholesky_ex(hd.flip(1, 2))
    usable = (info == 0) & (diag.sum(1) > 0) & torch.isfinite(hd).flatten(1).all(1)
    usable &= torch.isfinite(lower).flatten(1).all(1)
    m = torch.where(usable[:, None, None], lower.flip(1, 2), eye)  # the identity: nearest rounding, kept below
    acc, q = torch.zeros_like(w), torch.empty_like(w)
    for i in range(k):
        qc = torch.clamp(torch.round((w[:, i] + acc[:, i] / m[:, i, i]) / s), qmin, qmax)
        q[:, i] = qc
        acc[:, i + 1:] += (w[:, i] - qc * s)[:, None] * m[:, i, i + 1:]

    def err(levels):
        e = w - levels.double() * s[:, None]
        return torch.einsum("ni,nij,nj->n", e, h, e)

    before, after = err(nearest), err(q)
    better = usable & (after < before)
    q = torch.where(better[:, None], q, nearest.double()).to(torch.int8)
    # the proxy totals over the channels with a usable H (the others' errors may not be finite)
    total_before = float(before[usable].sum())
    total_after = float(torch.where(better, after, before)[usable].sum())
    info = {"method": "gptq" if bool(better.any()) else "nearest", "proxy_error_nearest": total_before,
            "proxy_error": total_after}
    if not bool(better.any()):
        info["why"] = "GPTQ did not lower the proxy error"
    return q, info


def round_weight(weight: torch.Tensor, scales: torch.Tensor, hessian: torch.Tensor, qmin: int, qmax: int,
                 nearest: torch.Tensor, factored=None) -> tuple[torch.Tensor, dict]:
    """(int8 Q of weight's shape, info) for a Linear's weight [N, K] and H [K, K] or a conv's
    weight [OC, C/G, KH, KW] and H [K, K] (G = 1) or [G, K, K]; `nearest`: the nearest-rounding Q
    (same shape), kept where GPTQ's proxy error is not lower; `factored`: factor(hessian), if
    already computed (G = 1)."""
    n = weight.shape[0]
    w2, q0 = weight.detach().float().reshape(n, -1), nearest.reshape(n, -1)
    if hessian.dim() == 2:
        q, info = gptq_round(w2, scales, hessian, qmin, qmax, nearest=q0, factored=factored)
        return q.reshape(weight.shape), info
    groups = hessian.shape[0]
    per = n // groups
    if per == 1:
        q, info = _rounded_per_channel(w2, scales.float(), hessian, qmin, qmax, q0)
        return q.reshape(weight.shape), info
    parts, before, after = [], 0.0, 0.0
    for g in range(groups):
        rows = slice(g * per, (g + 1) * per)
        qg, ig = gptq_round(w2[rows], scales[rows], hessian[g], qmin, qmax, nearest=q0[rows])
        parts.append(qg)
        b = ig.get("proxy_error_nearest", 0.0)  # absent where the group's H was unusable
        before += b
        after += ig["proxy_error"] if ig["method"] == "gptq" else b
    q = torch.cat(parts)
    method = "gptq" if after < before else "nearest"
    return q.reshape(weight.shape), {"method": method, "proxy_error_nearest": before, "proxy_error": after}


def corrected_bias(weight: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                   mean: torch.Tensor) -> torch.Tensor:
    """bias - (Q s - W) E[x] (fp64 arithmetic, float32 result): the bias that gives the rounded
    layer the float layer's mean output on the calibration rows. weight and q [N, ...] (a conv's
    [OC, C/G, KH, KW]), scales [N], mean E[x] over the layer's input rows [G x K] (im2col columns
    for a conv; G = the conv's groups)."""
    n = weight.shape[0]
    k = weight[0].numel()
    groups = mean.numel() // k
    if groups * k != mean.numel() or n % groups:
        raise ValueError(f"input mean of {mean.numel()} columns does not fit a weight of {k} columns per "
                         f"output channel and {n} output channels")
    # (Q s - W) E[x] per channel as s (Q E[x]) - W E[x]; one group: in blocks of channels whose fp64
    # copies stay in L2 (2.4x the whole-matrix product on 512 x 4608), else each group's channels
    # against its mean in one batched product
    if groups == 1:
        m = mean.double().reshape(k)
        q2, w2 = q.reshape(n, k), weight.detach().reshape(n, k)
        qm, wm = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
        rows = max(1, (1 << 17) // k)
        for r in range(0, n, rows):
            torch.mv(q2[r:r + rows].double(), m, out=qm[r:r + rows])
            torch.mv(w2[r:r + rows].double(), m, out=wm[r:r + rows])
    else:
        m = mean.double().reshape(groups, k, 1)
        qm = torch.bmm(q.reshape(groups, n // groups, k).double(), m).reshape(n)
        wm = torch.bmm(weight.detach().reshape(groups, n // groups, k).double(), m).reshape(n)
    shift = scales.double() * qm - wm
    b0 = bias.detach().double() if bias is not None else torch.zeros(n, dtype=torch.float64)
    return (b0 - shift).float()
