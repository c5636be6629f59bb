"""Regenerates the coefficients of the GELU epilogue (kGeluP / kGeluQ in gemm_common.h) (run: python gelu_erf_fit.py).

erf(u) ~ u * P(u^2) / Q(u^2) on [0, 4] (odd, so on [-4, 4]; erf(4) = 1 to fp32 precision), P of
degree 6 and Q of degree 4 with Q(0) = 1: a linearised least-squares fit on 4000 Chebyshev nodes,
reweighted by 1 / Q (Loeb) and by each node's error (Lawson) towards the minimax fit. The kernel
evaluates erf(y / sqrt 2), so u = y / sqrt 2 is folded into the coefficients. Prints them and the
fp32 (Horner) error of the whole gelu against the fp64 erf gelu. Needs numpy and scipy.
"""
import math

import numpy as np
from scipy.special import erf

DP, DQ, U = 6, 4, 4.0


def fit(iters: int = 60):
    u = (1 - np.cos(np.linspace(0, np.pi, 4000))) / 2 * U
    f, t = erf(u), u * u
    w, q_prev, best = np.ones_like(u), np.ones_like(u), None
    for _ in range(iters):
        a = np.concatenate([u[:, None] * t[:, None] ** np.arange(DP + 1),
                            -f[:, None] * t[:, None] ** np.arange(1, DQ + 1)], 1)
        sw = np.sqrt(w) / q_prev
        c, *_ = np.linalg.lstsq(a * sw[:, None], f * sw, rcond=None)
        p, q = c[:DP + 1], np.concatenate([[1.0], c[DP + 1:]])
        q_prev = np.polyval(q[::-1], t)
        err = u * np.polyval(p[::-1], t) / q_prev - f
        if best is None or np.abs(err).max() < best[0]:
            best = (np.abs(err).max(), p.copy(), q.copy())
        w = w * np.abs(err) + 1e-300
        w /= w.sum()
    return best


def horner32(coeffs, t):
    acc = np.float32(coeffs[-1])
    for c in coeffs[-2::-1]:
        acc = (acc * t + np.float32(c)).astype(np.float32)
    return acc


def main():
    err64, p, q = fit()
    pp = [p[k] / 2 ** k / math.sqrt(2) for k in range(DP + 1)]  # in y = u * sqrt 2
    qq = [q[k] / 2 ** k for k in range(DQ + 1)]
    print(f"erf fit error (fp64): {err64:.2e}")
    print("P (highest degree first):", ", ".join(f"{c:.10e}f" for c in pp[::-1]))
    print("Q (highest degree first):", ", ".join(f"{c:.10e}f" for c in qq[::-1]))
    y = np.linspace(-12, 12, 2_000_001)
    y32 = y.astype(np.float32)
    yc = np.clip(y32, np.float32(-U * math.sqrt(2)), np.float32(U * math.sqrt(2)))
    t = (yc * yc).astype(np.float32)
    h = (np.float32(0.5) * y32).astype(np.float32)
    g32 = (h + h * (yc * horner32(pp, t) / horner32(qq, t)).astype(np.float32)).astype(np.float32)
    exact = 0.5 * y32.astype(np.float64) * (1 + erf(y32.astype(np.float64) / math.sqrt(2)))
    rel = np.abs(g32.astype(np.float64) - exact) / np.maximum(np.abs(y32.astype(np.float64)), 1e-3)
    print(f"gelu fp32 error: <= {rel.max():.2e} * |y|")


if __name__ == "__main__":
    main()
