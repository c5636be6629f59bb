"""GPTQ weight rounding (qbackend/algorithms/gptq.py): the Hessian recorder against X^T X in fp64,
the rounding against the output error it is meant to lower (measured directly as |X (W - Q s)^T|^2
on the calibration rows, not through H), its grid (the observer's scales, levels in range), its
fall-backs to nearest rounding, and the whole path: a model with correlated Linear inputs is
closer to FP32 with "gptq" than with "nearest", each int8 layer still exact on its integers."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qbackend
from qbackend.algorithms.gptq import PROXY_ROWS, HessianStats, factor, gptq_columns_ref, gptq_round
from qbackend.nn.weights import quantize_weight

from ..lowering.toy_models import sqnr


def correlated_rows(n: int, k: int, g: torch.Generator, rank: int = 8) -> torch.Tensor:
    """Rows with strongly correlated features (a few latent factors plus noise), as LayerNorm
    outputs of trained models have: where error-compensating rounding pays."""
    latent = torch.randn(n, rank, generator=g)
    mix = torch.randn(rank, k, generator=g)
    return latent @ mix + 0.1 * torch.randn(n, k, generator=g)


def output_error(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> float:
    return float((x.double() @ (w.double() - q.double() * scales.double()[:, None]).t()).pow(2).sum())


def test_hessian_stats_is_xtx_and_skips_nonfinite_rows():
    g = torch.Generator().manual_seed(0)
    rec = HessianStats("x")
    batches = [torch.randn(3, 5, 16, generator=g) for _ in range(3)]
    batches[1][0, 2, 4] = float("nan")
    batches[2][2, 0, 0] = float("inf")
    for b in batches:
        rec(b)
    rows = torch.cat([b.reshape(-1, 16) for b in batches])
    rows = rows[torch.isfinite(rows).all(dim=1)].double()
    assert rec.rows == rows.shape[0] == 45 - 2
    torch.testing.assert_close(rec.hessian.double(), rows.t() @ rows, rtol=1e-5, atol=1e-4)


def test_wide_hessian_from_its_lower_blocks_is_xtx():
    """A wide H accumulates its lower block triangle only; read between and after adds, it is the
    whole symmetric X^T X."""
    g = torch.Generator().manual_seed(4)
    rec = HessianStats("x")
    batches = [torch.randn(2, 70, 1100, generator=g) for _ in range(3)]
    rec(batches[0])
    first = batches[0].reshape(-1, 1100).double()
    torch.testing.assert_close(rec.hessian.double(), first.t() @ first, rtol=1e-5, atol=1e-3)
    for b in batches[1:]:
        rec(b)
    rows = torch.cat([b.reshape(-1, 1100) for b in batches]).double()
    h = rec.hessian
    assert torch.equal(h, h.t())
    torch.testing.assert_close(h.double(), rows.t() @ rows, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("n,k", [(48, 64), (130, 200), (7, 300)])
def test_gptq_lowers_the_output_error_on_the_calibration_rows(n, k):
    g = torch.Generator().manual_seed(n + k)
    x = correlated_rows(4 * k, k, g)
    w = torch.randn(n, k, generator=g) * 0.05
    q0, scales = quantize_weight(w)
    q, info = gptq_round(w, scales, x.t().double() @ x.double(), -128, 127, nearest=q0)
    assert info["method"] == "gptq" and q.dtype == torch.int8 and q.shape == w.shape
    assert int(q.min()) >= -128 and int(q.max()) <= 127
    before, after = output_error(x, w, q0, scales), output_error(x, w, q, scales)
    assert 10 * math.log10(before / after) > 3.0, (before, after)
    # the proxy GPTQ reports is that same error (H = X^T X), up to fp32 rounding, on its sample of
    # PROXY_ROWS output channels where there are more
    rows = torch.arange(n) if n <= PROXY_ROWS else \
        torch.randperm(n, generator=torch.Generator().manual_seed(0))[:PROXY_ROWS]
    assert info["proxy_error"] == pytest.approx(output_error(x, w[rows], q[rows], scales[rows]), rel=1e-3)
    assert info["proxy_error_nearest"] == pytest.approx(output_error(x, w[rows], q0[rows], scales[rows]), rel=1e-3)
    # the levels move, but only near the nearest ones (the grid is the observer's)
    assert int((q.int() - q0.int()).abs().max()) <= 8
    # on fresh rows from the same distribution it also helps (not an overfit to the sample)
    fresh = correlated_rows(4 * k, k, torch.Generator().manual_seed(n + k))
    assert output_error(fresh, w, q, scales) < output_error(fresh, w, q0, scales)


@pytest.mark.parametrize("n,k,block,qmin,qmax", [(48, 64, 128, -128, 127), (130, 200, 128, -128, 127),
                                                (7, 300, 32, -8, 7), (1, 1, 128, -128, 127), (33, 129, 128, 0, 15)])
def test_native_column_loop_is_its_reference_bit_for_bit(n, k, block, qmin, qmax):
    """The C++ column loop against the torch-op loop: the same float32 steps, so equal bit for bit
    (also where levels saturate at qmin / qmax: scales too small for the weights)."""
    g = torch.Generator().manual_seed(n * k)
    x = correlated_rows(2 * k + 4, k, g)
    order, lower = factor(x.t() @ x)
    w = (torch.randn(n, k, generator=g) * 0.05)[:, order].contiguous()
    scales = w.abs().amax(1) / (qmax - qmin) * (0.5 if qmin < 0 else 4.0) + 1e-6
    got = torch.ops.qbackend.gptq_round_columns(w, lower, scales, qmin, qmax, block)
    want = gptq_columns_ref(w, lower, scales, qmin, qmax, block)
    assert torch.equal(got, want)
    assert not lower.is_contiguous() or k == 1  # as the factorization gives it (column-major) ...
    assert torch.equal(torch.ops.qbackend.gptq_round_columns(w, lower.contiguous(), scales, qmin, qmax, block), got)
    assert float(got.min()) >= qmin and float(got.max()) <= qmax and torch.equal(got, got.round())
    assert got.min() == qmin or got.max() == qmax  # the clamp was exercised


def test_native_column_loop_names_bad_arguments():
    w, u, s = torch.zeros(3, 4), torch.eye(4), torch.ones(3)
    with pytest.raises(ValueError, match="l must be"):
        torch.ops.qbackend.gptq_round_columns(w, torch.eye(5), s, -128, 127, 128)
    with pytest.raises(ValueError, match="scales must"):
        torch.ops.qbackend.gptq_round_columns(w, u, torch.ones(2), -128, 127, 128)
    with pytest.raises(TypeError, match="w must have dtype torch.float32"):
        torch.ops.qbackend.gptq_round_columns(w.double(), u, s, -128, 127, 128)
    with pytest.raises(ValueError, match="block"):
        torch.ops.qbackend.gptq_round_columns(w, u, s, -128, 127, 0)


def test_uncorrelated_inputs_keep_nearest_rounding():
    """H = c * I: no column can compensate another, GPTQ is nearest rounding, which is kept."""
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    q0, scales = quantize_weight(w)
    q, info = gptq_round(w, scales, 5.0 * torch.eye(32, dtype=torch.float64), -128, 127, nearest=q0)
    assert torch.equal(q, q0) and info["method"] == "nearest"


def test_unusable_hessians_fall_back_to_nearest():
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    q0, scales = quantize_weight(w)
    assert factor(torch.zeros(8, 8, dtype=torch.float64)) is None
    q, info = gptq_round(w, scales, torch.zeros(8, 8, dtype=torch.float64), -128, 127, nearest=q0)
    assert torch.equal(q, q0) and info["method"] == "nearest"
    # a column never seen (zero energy) is rounded to nearest, the others still compensate
    g = torch.Generator().manual_seed(3)
    x = correlated_rows(64, 8, g, rank=2)
    x[:, 5] = 0
    q, info = gptq_round(w, scales, x.t().double() @ x.double(), -128, 127, nearest=q0)
    assert torch.equal(q[:, 5], q0[:, 5])


class Correlated(nn.Module):
    def __init__(self, k=64, h=96, out=16):
        super().__init__()
        self.norm = nn.LayerNorm(k)
        self.fc1, self.fc2 = nn.Linear(k, h), nn.Linear(h, out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.norm(x))))


def test_gptq_model_is_closer_to_fp32_and_layers_stay_exact():
    from ..lowering.layer_reference import check_layers  # the per-layer fp64 reference on the same integers

    torch.manual_seed(0)
    model = Correlated().eval()
    g = torch.Generator().manual_seed(5)
    mix = torch.randn(6, 64, generator=g)
    data = [(torch.randn(32, 6, generator=g) @ mix + 0.05 * torch.randn(32, 64, generator=g),) for _ in range(6)]
    ref = [model(*d) for d in data[4:]]
    out = {}
    for rounding in ("nearest", "gptq"):
        q = qbackend.quantize(model, data[0], data[:4],
                              config=qbackend.QuantConfig(weight_rounding=rounding, bias_correction=False,
                                                          seven_bit_for_speed=False))  # 8-bit on every CPU
        out[rounding] = min(sqnr(r, q(*d)) for r, d in zip(ref, data[4:]))
        records = [info.weight_rounding for info in q.qbackend_layers.values()]
        if rounding == "gptq":
            assert all(r is not None and r["method"] == "gptq" and r["gain_db"] > 0 for r in records), records
            assert check_layers(q, *data[4]) == 2
        else:
            assert all(r is None for r in records)
    assert out["gptq"] > out["nearest"] + 1.0, out


def test_nearest_records_no_hessians():
    model = Correlated().eval()
    x = torch.randn(8, 64)
    p = qbackend.prepare(model, (x,), config=qbackend.QuantConfig(weight_rounding="nearest", bias_correction=False))
    assert not any(isinstance(m, HessianStats) for m in p.modules())
    # bias correction alone records the inputs' means, not H
    p = qbackend.prepare(model, (x,), config=qbackend.QuantConfig(weight_rounding="nearest"))
    recorders = [m for m in p.modules() if isinstance(m, HessianStats)]
    assert len(recorders) == 2 and not any(m.second_moment for m in recorders)
    p = qbackend.prepare(model, (x,))
    assert sum(isinstance(m, HessianStats) and m.second_moment for m in p.modules()) == 2


def test_config_rejects_unknown_rounding():
    with pytest.raises(ValueError, match="weight_rounding must be one of gptq, nearest"):
        qbackend.QuantConfig(weight_rounding="adaround")


def test_upper_cholesky_factors_the_damped_hessian():
    from qbackend.algorithms.gptq import DAMP, upper_cholesky

    g = torch.Generator().manual_seed(9)
    x = correlated_rows(300, 48, g, rank=6)
    h = x.t().double() @ x.double()
    m = upper_cholesky(h.float())
    assert m.dtype == torch.float32 and torch.equal(m, m.triu())
    damped = h + DAMP * float(torch.diagonal(h).mean()) * torch.eye(48, dtype=torch.float64)
    assert float((m.double() @ m.double().t() - damped).abs().max()) <= 1e-5 * float(damped.abs().max())


def test_lower_cholesky_factors_the_reordered_damped_hessian():
    """L lower triangular with L L^T = H[order][:, order] + damping, columns never seen taking
    H_cc = 1; fp64 where fp32 is not positive definite enough."""
    from qbackend.algorithms.gptq import DAMP, lower_cholesky

    g = torch.Generator().manual_seed(11)
    x = correlated_rows(200, 40, g, rank=5)
    x[:, 7] = 0.0  # a column never seen
    h = (x.t().double() @ x.double()).float()
    order = torch.randperm(40, generator=g)
    got = lower_cholesky(h, order)
    assert got.dtype == torch.float32 and torch.equal(got, got.tril())
    ref = h.double()[order][:, order]
    seen = int((order == 7).nonzero())
    ref[seen, seen] = 1.0
    ref += DAMP * float(torch.diagonal(ref).mean()) * torch.eye(40, dtype=torch.float64)
    assert float((got.double() @ got.double().t() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    assert h[7, 7] == 0.0  # the caller's H is not modified


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocked_cholesky_factors_wide_matrices(dtype):
    """Above two diagonal blocks the factor is blocked (in place): against LAPACK's in fp64, and
    None for a matrix that is not positive definite in a late or the first block."""
    from qbackend.algorithms.gptq import CHOLESKY_BLOCK, _cholesky

    k = 2 * CHOLESKY_BLOCK + 77
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2 * k, k, generator=g, dtype=torch.float64)
    a = x.t() @ x
    got = _cholesky(a.to(dtype, copy=True))  # overwritten
    assert got is not None and got.dtype == dtype and torch.equal(got, got.tril())
    lapack = torch.linalg.cholesky(a.to(dtype)).double()
    # backward error: as small as LAPACK's own (the factor of an ill-conditioned H differs more)
    rebuilt, rebuilt_lapack = got.double() @ got.double().t(), lapack @ lapack.t()
    err, err_lapack = float((rebuilt - a).abs().max()), float((rebuilt_lapack - a).abs().max())
    assert err <= 4 * err_lapack + 1e-12 * float(a.abs().max())
    assert err <= (1e-5 if dtype == torch.float32 else 1e-13) * float(a.abs().max())
    for bad in (k - 3, 5):
        b = a.clone()
        b[bad, bad] = -1.0
        assert _cholesky(b.to(dtype, copy=True)) is None


def _textbook_gptq(w: torch.Tensor, h: torch.Tensor, scales: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """GPTQ as its paper states it, in fp64, one column at a time: U the upper Cholesky factor of
    (H + damping)^-1, column i rounded, its error (w_i - q_i s) / U_ii taken off the later columns
    through row i of U."""
    from qbackend.algorithms.gptq import DAMP

    k = h.shape[0]
    damped = h + DAMP * float(torch.diagonal(h).mean()) * torch.eye(k, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)
    w, s = w.double().clone(), scales.double()
    q = torch.empty_like(w)
    for i in range(k):
        q[:, i] = torch.clamp(torch.round(w[:, i] / s), qmin, qmax)
        e = (w[:, i] - q[:, i] * s) / u[i, i]
        w[:, i:] -= e[:, None] * u[i, i:][None, :]
    return q


@pytest.mark.parametrize("n,k", [(40, 64), (24, 200)])
def test_column_loop_gives_the_textbook_levels(n, k):
    """The loop on M (M M^T = H + damping) against GPTQ's H^-1 form in fp64 (the paper's update):
    the same levels up to float rounding at ties, and the same proxy error."""
    g = torch.Generator().manual_seed(k)
    x = correlated_rows(3 * k, k, g)
    h = x.t().double() @ x.double()
    w = torch.randn(n, k, generator=g) * 0.05
    q0, scales = quantize_weight(w)
    order, lower = factor(h.float())
    got = torch.ops.qbackend.gptq_round_columns(w[:, order].contiguous(), lower, scales, -128, 127, 32)
    perm = order.flip(0)  # the order GPTQ rounds in: the loop takes it reversed
    want = _textbook_gptq(w[:, perm], h[perm][:, perm], scales, -128, 127)
    assert float((got.flip(1).double() != want).double().mean()) <= 0.002
    levels = got[:, torch.argsort(order)]

    def err(q):
        return float(output_error(x, w, q, scales))

    assert err(levels) == pytest.approx(err(want[:, torch.argsort(perm)]), rel=1e-3)
    assert err(levels) < err(q0)


@pytest.mark.parametrize("k", [1, 5, 130, 600])
@pytest.mark.parametrize("src, dst", [(torch.float64, torch.float32), (torch.float64, torch.float64),
                                      (torch.float32, torch.float32), (torch.float32, torch.float64)])
def test_ordered_square_is_the_indexed_matrix(k, src, dst):
    """qbackend::ordered_square: h[order[:, None], order] in `dtype`, bit for bit, for any order
    (repeats too) and a non-contiguous h."""
    g = torch.Generator().manual_seed(k)
    h = torch.randn(k, k, generator=g, dtype=torch.float64).to(src)
    for order in (torch.randperm(k, generator=g), torch.randint(0, k, (k,), generator=g)):
        got = torch.ops.qbackend.ordered_square(h, order, dst)
        assert got.dtype == dst and got.is_contiguous()
        assert torch.equal(got, h[order[:, None], order].to(dst))
    ht = h.t()
    order = torch.randperm(k, generator=g)
    assert torch.equal(torch.ops.qbackend.ordered_square(ht, order, dst), ht[order[:, None], order].to(dst))


@pytest.mark.parametrize("h, order, dtype, exc, pattern", [
    (torch.ones(3, 4), torch.arange(3), torch.float32, ValueError, "h must be square"),
    (torch.ones(3, 3), torch.arange(2), torch.float32, ValueError, "order must be 1-D of length K = 3"),
    (torch.ones(3, 3), torch.tensor([0, 3, 1]), torch.float32, ValueError, r"indices in \[0, 3\), got 3 at 1"),
    (torch.ones(3, 3), torch.tensor([0, -1, 1]), torch.float32, ValueError, "got -1"),
    (torch.ones(3, 3), torch.arange(3).int(), torch.float32, TypeError, "order must have dtype torch.int64"),
    (torch.ones(3, 3).half(), torch.arange(3), torch.float32, TypeError, "h must have dtype"),
    (torch.ones(3, 3), torch.arange(3), torch.int32, TypeError, "dtype must be"),
])
def test_ordered_square_bad_arguments(h, order, dtype, exc, pattern):
    with pytest.raises(exc, match=pattern):
        torch.ops.qbackend.ordered_square(h, order, dtype)
