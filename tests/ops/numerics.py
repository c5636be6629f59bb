"""Shared by the linear and conv2d numerics tests: the provider list, hypothesis settings, the
one-thread fixture, the test-data generators, and the acceptance rule (error_metrics + assert_rule; the rule is stated in
test_linear.py's and test_conv2d.py's docstrings)."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from qbackend.core.extension import _C
from qbackend.ops import PROVIDERS
from qbackend.ops import reference as R

# The native provider runs where the CPU (and QBACKEND_ISA) has AVX2; its own tests check that it
# refuses to run elsewhere (tests/ops/test_native.py).
NATIVE = ["native"] if _C.native_isa() else []
FAST = ["fbgemm", "onednn"] + NATIVE   # Linear
CONV_FAST = ["fbgemm", "onednn"]       # every conv geometry (native: 1x1 only, its own tests)
OUT_DTYPES = [torch.uint8, torch.int8, torch.float32, torch.bfloat16]
POST_OPS = ["none", "relu", "gelu"]
ALL_THREADS = torch.get_num_threads()
HSET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# The native kernels the depthwise and fused-block tests run: this CPU's choice ("") and, where that
# is the AVX512-VNNI one, the AVX2 kernels too (set_native_kernel("avx2") selects them on any AVX2 CPU).
NATIVE_KERNELS = [""] + (["avx2"] if int(_C.usable_isa()) >= 3 else [])


def use_native_kernel(request):
    """Body of a fixture parametrized over NATIVE_KERNELS: the native ops run on that kernel until
    the test ends."""
    _C.set_native_kernel(request.param)
    try:
        yield request.param
    finally:
        _C.set_native_kernel("")


class all_threads:
    """Within the block, torch uses all the threads it had when this module was imported; after
    it, the count it had before (not a fixed 1: a module without the one_thread fixture must not
    leave later modules on one thread)."""

    def __enter__(self):
        self._before = torch.get_num_threads()
        torch.set_num_threads(ALL_THREADS)

    def __exit__(self, *exc):
        torch.set_num_threads(self._before)


# ----------------------------------------------------------------------------- the acceptance rule

def error_metrics(y, y64, bound, out_dtype, out_scale=1.0, out_zp=0):
    """How far y (a provider's output) is from y64 (the fp64 reference before output quantization).

    numel; for integer outputs max_lsb (largest |y - reference| in LSBs), n_off (elements off by at
    least one) and untied (off elements whose fp64 value is not within the fp32 tolerance of a .5
    tie); for float outputs err_ratio = max |y - ref| / tolerance (<= 1 passes).
    """
    y64, bound = y64.double(), bound.double()
    m = {"numel": y64.numel(), "max_lsb": 0, "n_off": 0, "untied": 0, "err_ratio": 0.0}
    if y64.numel() == 0:
        return m
    if out_dtype in R.QRANGE:
        ref = R.quantize(y64, out_scale, out_zp, out_dtype).long()
        diff = (y.long() - ref).abs()
        off = diff > 0
        s = R.f32(out_scale)
        v = y64 / s
        slack = (1e-5 * bound + 1e-6) / s
        untied = off & ((v - v.floor() - 0.5).abs() > slack)
        m.update(max_lsb=int(diff.max()), n_off=int(off.sum()), untied=int(untied.sum()))
    else:
        tol = (1e-5 if out_dtype == torch.float32 else 2.0 ** -8) * bound + 1e-6
        m["err_ratio"] = float(((y.double() - y64).abs() / tol).max())
    return m


def assert_rule(m, what):
    """The acceptance rule of the module docstring, on error_metrics' result."""
    assert m["max_lsb"] <= 1, f"{what}: off by {m['max_lsb']} LSB ({m})"
    assert m["untied"] == 0, f"{what}: {m['untied']} elements off by 1 LSB away from a rounding tie ({m})"
    if m["numel"] >= 100:
        assert m["n_off"] < 0.01 * m["numel"], f"{what}: {m['n_off']} of {m['numel']} elements off by 1 ({m})"
    else:
        assert m["n_off"] <= 1, f"{what}: {m['n_off']} of {m['numel']} elements off by 1 ({m})"
    assert m["err_ratio"] <= 1.0, f"{what}: error {m['err_ratio']:.3g}x the tolerance ({m})"


# ----------------------------------------------------------------------------- test data

def exact_8bit(provider: str) -> bool:
    return PROVIDERS[provider].exact_8bit()


def zero_points(dtype):
    """The range ends (and 0 for int8) often, anything in the range otherwise."""
    lo, hi = R.QRANGE[dtype]
    ends = [lo, hi] if dtype == torch.uint8 else [lo, hi, 0]
    return st.one_of(st.sampled_from(ends), st.integers(lo, hi))


def activations(shape, dtype, zp, mode, seven_bit, g):
    """int8/uint8 activations: full range, only the two ends, near the zero point, or [0, 127]."""
    lo, hi = R.QRANGE[dtype]
    if seven_bit or mode == "seven_bit":
        lo, hi = (0, 127) if dtype == torch.uint8 else (lo, hi)
    if mode == "ends":
        v = torch.where(torch.rand(shape, generator=g) < 0.5, lo, hi)
    elif mode == "near_zp":
        v = (torch.randint(-4, 5, shape, generator=g) + zp).clamp(lo, hi)
    else:
        v = torch.randint(lo, hi + 1, shape, generator=g)
    return v.to(dtype)


def weights(shape, mode, g):
    """Symmetric int8 weights in [-127, 127]: uniform, only +-127, or mostly zero."""
    if mode == "ends":
        return torch.where(torch.rand(shape, generator=g) < 0.5, -127, 127).to(torch.int8)
    w = torch.randint(-127, 128, shape, generator=g)
    if mode == "sparse":
        w = torch.where(torch.rand(shape, generator=g) < 0.8, 0, w)
    return w.to(torch.int8)


def log_uniform(g, n, lo, hi):
    return (10 ** (torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo)).float()


def output_scale_for(y64, span):
    """An output scale that puts the largest |y| about `span` LSBs away from zero (> 127: some
    saturate). The odd factor keeps it from being a round fraction of max |y|, which would put
    structured inputs (x and w at their range ends) on exact rounding ties by construction."""
    amax = float(y64.abs().max()) if y64.numel() else 1.0
    return R.f32(max(amax, 1e-3) / span * 1.0731)


def dynamic_reference_input(x, reduce_range):
    """(q, scale, zp): reference.quantize with the reference's dynamic qparams, taking the fp32
    division's code where x / scale is an exact .5 tie that fp32 rounds the other way (the 1 LSB
    the quantize contract allows); AssertionError where they differ off a tie."""
    scale, zp = R.choose_dynamic_qparams(x, reduce_range)
    q = R.quantize(x, scale, zp, torch.uint8)
    q32 = (torch.round(x.float() / torch.tensor(scale, dtype=torch.float32)) + zp).clamp(0, 255).to(torch.uint8)
    diff = q.long() != q32.long()
    if diff.any():
        v = x.double()[diff] / scale
        assert ((q.long() - q32.long()).abs().max() <= 1 and
                ((v - v.floor() - 0.5).abs() <= 1e-6 * v.abs() + 1e-12).all()), "quantize differs off a tie"
    return torch.where(diff, q32, q), scale, zp


def embedding_levels(table_q, dim, bits):
    """fp64 (scale, bias, q) of a fused table, read independently of the kernels."""
    nb = dim if bits == 8 else dim // 2
    qp_bytes = table_q.shape[1] - nb
    qp_dtype = torch.float16 if qp_bytes == 4 else torch.float32
    # rows: [scale][bias][data]; through numpy, as a one-row slice keeps its (odd) row stride
    qp = torch.from_numpy(table_q[:, :qp_bytes].numpy().copy().view(np.float16 if qp_bytes == 4 else np.float32))
    qp = qp.to(qp_dtype).double()
    data = table_q[:, qp_bytes:].long()
    q = data if bits == 8 else torch.stack([data % 16, data // 16], 2).reshape(-1, dim)
    return qp[:, 0], qp[:, 1], q.double()


def embedding_bags_fp64(table_q, dim, bits, indices, offsets, mode, psw, include_last, padding_idx):
    """fp64: rows dequantized exactly, weighted, summed / averaged over each bag (padding skipped);
    also the sum of |terms| per bag (for the fp32 rounding bound)."""
    scale, bias, q = embedding_levels(table_q, dim, bits)
    values = scale[:, None] * q + bias[:, None]
    n = indices.numel()
    ends = list(offsets[1:].tolist()) + ([] if include_last else [n])
    starts = offsets[:-1].tolist() if include_last else offsets.tolist()
    out, mag = torch.zeros(len(starts), dim, dtype=torch.float64), torch.zeros(len(starts), dtype=torch.float64)
    for b, (s, e) in enumerate(zip(starts, ends)):
        rows = [(i, int(indices[i])) for i in range(s, e) if int(indices[i]) != padding_idx]
        for i, r in rows:
            w = 1.0 if psw is None else float(psw[i])
            out[b] += w * values[r]
            mag[b] += abs(w) * (float(values[r].abs().max()) + 2 * abs(float(bias[r])))  # bounds |s q|, |b|, |s q + b|
        if mode == "mean" and rows:
            out[b] /= len(rows)
            mag[b] /= len(rows)
    return out, mag
