"""Tests of the observer ops torch.ops.qbackend.{finite_minmax, histogram_pow2, histogram_search_l2,
histogram_quant_error}.

Oracles: torch/numpy for min/max and counts (numpy.histogram on the same exact edges), numerical
integration for the error model, a plain Python transcription of the greedy search, and the
other ISAs (scalar, AVX2, AVX512 in child processes, which must agree bit for bit). Bad input
runs in a child process so that a crash fails a test, not pytest.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qbackend
import qbackend.ops  # noqa: F401  (fake impls)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from subprocess_utils import assert_op_error, op_error_params, run_op_error_cases, run_py  # noqa: E402

OPS = torch.ops.qbackend
HSET = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def special_values(n: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    """float32 data with NaN, +-inf, +-0, subnormals and a wide spread of magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * scale
    if n:
        r = torch.rand(n, generator=g)
        x = torch.where(r < 0.05, torch.zeros(()), x)
        x = torch.where((r >= 0.05) & (r < 0.08), torch.tensor(-0.0), x)
        x = torch.where((r >= 0.08) & (r < 0.10), torch.tensor(float("nan")), x)
        x = torch.where((r >= 0.10) & (r < 0.11), torch.tensor(float("inf")), x)
        x = torch.where((r >= 0.11) & (r < 0.12), torch.tensor(-float("inf")), x)
        x = torch.where((r >= 0.12) & (r < 0.13), torch.tensor(1e-40), x)
    return x


def ref_minmax(x: torch.Tensor):
    f = x.float()
    fin = f[torch.isfinite(f)]
    nf = f.numel() - fin.numel()
    if fin.numel() == 0:
        return math.inf, -math.inf, nf
    return float(fin.min()), float(fin.max()), nf


# ----------------------------------------------------------------------------- finite_minmax

@HSET
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**31 - 1), bf16=st.booleans(),
       layout=st.sampled_from(["contiguous", "strided"]))
def test_finite_minmax_per_tensor(n, seed, bf16, layout):
    x = special_values(n, seed)
    if bf16:
        x = x.bfloat16()
    if layout == "strided":
        big = torch.zeros(2 * n, dtype=x.dtype)
        big[::2] = x
        x = big[::2]
    mn, mx, nf = OPS.finite_minmax(x)
    assert mn.dtype == mx.dtype == torch.float32 and nf.dtype == torch.int64 and mn.dim() == 0
    assert (float(mn), float(mx), int(nf)) == ref_minmax(x)
    for v in (mn, mx):  # a zero min/max is +0.0 whatever the order of -0.0 / +0.0 in x
        if float(v) == 0.0:
            assert math.copysign(1.0, float(v)) == 1.0


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "offset_channels_last"])
def test_per_tensor_statistics_read_dense_layouts_in_place(layout):
    """A dense tensor in another dim order (channels-last activations) is read as it lies, not
    copied: per-tensor min/max and histograms equal those of its contiguous copy bit for bit."""
    x = special_values(2 * 5 * 7 * 9, 11).reshape(2, 5, 7, 9)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(0, 3)
    else:
        big = special_values(3 * 5 * 7 * 9, 12).reshape(3, 5, 7, 9).contiguous(memory_format=torch.channels_last)
        x = big[1:]  # storage offset 5*7*9, still dense
        assert x.storage_offset() > 0
    assert not x.is_contiguous() and torch.empty_like(x).stride() == x.stride()  # dense: its strides kept
    c = x.contiguous()
    assert [float(v) for v in OPS.finite_minmax(x)] == [float(v) for v in OPS.finite_minmax(c)]
    mn, mx, _ = OPS.finite_minmax(c)
    k, off = -2, math.floor(float(mn) * 4)
    bins = math.floor(float(mx) * 4) - off + 1
    got, want = OPS.histogram_pow2(x, k, off, bins), OPS.histogram_pow2(c, k, off, bins)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and int(got[0].sum()) > 0


def test_finite_minmax_large_and_signed_zero():
    x = special_values(2_000_003, 3, 100.0)  # several threads and kernel blocks
    mn, mx, nf = OPS.finite_minmax(x)
    assert (float(mn), float(mx), int(nf)) == ref_minmax(x)
    z = torch.tensor([-0.0, 0.0, -0.0] * 50)
    mn, mx, _ = OPS.finite_minmax(z)
    assert math.copysign(1.0, float(mn)) == 1.0 and math.copysign(1.0, float(mx)) == 1.0
    mn, mx, nf = OPS.finite_minmax(torch.tensor([float("nan")] * 37))
    assert float(mn) == math.inf and float(mx) == -math.inf and int(nf) == 37


@pytest.mark.parametrize("shape,axis", [((5, 7, 40), 1), ((5, 7, 40), 0), ((5, 7, 40), -1), ((300, 3), 1),
                                        ((9,), 0), ((4, 0, 3), 2), ((2, 3, 4, 5), 2)])
def test_finite_minmax_per_channel(shape, axis):
    x = special_values(int(np.prod(shape)), 17).reshape(shape)
    mn, mx, nf = OPS.finite_minmax(x, axis)
    c = shape[axis]
    assert mn.shape == mx.shape == nf.shape == (c,)
    xt = x.movedim(axis, 0).reshape(c, -1)
    for i in range(c):
        assert (float(mn[i]), float(mx[i]), int(nf[i])) == ref_minmax(xt[i])


# ----------------------------------------------------------------------------- histogram_pow2

def ref_histogram(x: torch.Tensor, k: int, offset: int, bins: int):
    """numpy.histogram on the exact edges (offset + j) * 2^k; numpy's last bin is closed, so the
    edge itself is counted as outside here."""
    f = x.float().double().numpy()
    fin = f[np.isfinite(f)]
    edges = (np.arange(offset, offset + bins + 1, dtype=np.float64)) * math.ldexp(1.0, k)
    inside = fin[(fin >= edges[0]) & (fin < edges[-1])]
    counts, _ = np.histogram(inside, bins=edges)
    return counts, fin.size - inside.size, f.size - fin.size


@HSET
@given(n=st.integers(0, 4000), seed=st.integers(0, 2**31 - 1), k=st.integers(-12, 4), bins=st.integers(1, 700),
       offset=st.integers(-400, 100), bf16=st.booleans())
def test_histogram_vs_numpy(n, seed, k, bins, offset, bf16):
    x = special_values(n, seed, scale=2.0 ** (k + 6))
    if bf16:
        x = x.bfloat16()
    counts, mn, mx, nf, outside = OPS.histogram_pow2(x, k, offset, bins)
    want, want_out, want_nf = ref_histogram(x, k, offset, bins)
    assert counts.dtype == torch.int64 and counts.shape == (bins,)
    assert np.array_equal(counts.numpy(), want)
    assert int(outside) == want_out and int(nf) == want_nf
    assert (float(mn), float(mx), int(nf)) == ref_minmax(x)


@pytest.mark.parametrize("k,offset,scale", [(-183, 0, 1e-44), (-140, -5, 1e-38), (100, -3, 1e32), (-30, 2**33, None),
                                            (118, -2, 3e36), (126, -1, 1e38), (-126, 0, 1e-36), (-8, 2**30 - 4096, 1.0),
                                            (-8, -(2**30) + 100, 1.0), (-8, 2**30 - 4000, None)])
def test_histogram_extreme_windows(k, offset, scale):
    """Tiny and huge widths, and bin numbers near 2^33 (float32 values far from 0, finely binned)."""
    if scale is None:  # values around 8 with 2^-30 wide bins: bin numbers 2^33 + small
        x = torch.tensor([8.0, 8.0 + 2**-20, 8.0 + 2**-21 * 3, 8.5, 7.99], dtype=torch.float32)
    else:
        x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * scale
    # tiny values: with a huge width their product with 2^-k underflows (bin 0, or -1 if negative)
    x = torch.cat([x, torch.tensor([-1e-30, 1e-30, -0.0, -1e-45, 1e-45, -3e38, 3e38])])
    counts, *_, outside = OPS.histogram_pow2(x, k, offset, 4096)
    want, want_out, _ = ref_histogram(x, k, offset, 4096)
    assert np.array_equal(counts.numpy(), want) and int(outside) == want_out


@pytest.mark.parametrize("offset", [-64, 3])
def test_histogram_zero_density_changes(offset):
    """Stretches with and without exact zeros in one call (the AVX512 kernel switches between
    compressing zeros out and binning them per block), the bin of 0 in or out of the window."""
    g = torch.Generator().manual_seed(8)
    parts = [torch.randn(50_000, generator=g), torch.relu(torch.randn(50_000, generator=g)),
             torch.randn(30_000, generator=g), torch.zeros(4_099), torch.randn(5_000, generator=g) * 0.01]
    parts[2][::7] = 0.0  # sparse zeros
    x = torch.cat(parts)
    for xx in (x, x.bfloat16()):
        counts, *_, outside = OPS.histogram_pow2(xx, -6, offset, 1024)
        want, want_out, _ = ref_histogram(xx, -6, offset, 1024)
        assert np.array_equal(counts.numpy(), want) and int(outside) == want_out


def test_histogram_large_threads_and_zeros():
    """Many threads' partial histograms and > 2^18 elements per thread (uint16 row flushes), a
    ReLU-like half of exact zeros, zero outside the window."""
    g = torch.Generator().manual_seed(5)
    x = torch.relu(torch.randn(3_000_001, generator=g))
    x[::1000] = -0.0
    for offset in (0, -10, 5):  # the bin of 0 in the window, in it at bin 10, or outside
        counts, _, _, nf, outside = OPS.histogram_pow2(x, -8, offset, 2048)
        want, want_out, _ = ref_histogram(x, -8, offset, 2048)
        assert np.array_equal(counts.numpy(), want) and int(outside) == want_out and int(nf) == 0
    # one bin gets every count: the uint16 counters of each thread must be flushed in time
    for n in (8 * 65535 + 9, 3_000_017):
        const = torch.full((n,), 2.5)
        counts, *_ = OPS.histogram_pow2(const, -1, 0, 16)
        assert int(counts[5]) == n and int(counts.sum()) == n


# ----------------------------------------------------------------------------- error model and search

def hist_of(x: torch.Tensor, bins: int):
    from qbackend.observers import HistogramObserver

    h = HistogramObserver(bins=bins, reduce_range=False)
    h.update(x)
    return h


def numeric_error(h, c0: float, step: float, levels: int, k: int = 4000) -> float:
    """Midpoint-rule integral of (x - q(x))^2 over each bin's uniform mass."""
    lower, upper = (t.numpy() for t in h.bin_bounds())
    counts = h.counts.double().numpy()
    total = 0.0
    for j in np.nonzero(counts)[0]:
        lo, hi = lower[j], upper[j]
        xs = lo + (np.arange(k) + 0.5) / k * (hi - lo) if hi > lo else np.array([lo])
        idx = np.clip(np.floor((xs - c0) / step + 0.5), 0, levels - 1) if step > 0 else np.zeros_like(xs)
        total += counts[j] * np.mean((xs - (c0 + idx * step)) ** 2)
    return total


@pytest.mark.parametrize("seed", range(4))
def test_quant_error_vs_integration(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(4000, generator=g) * 2, torch.rand(50, generator=g) * 20 - 5])
    h = hist_of(x, 64)
    lo, hi = h.min_val, h.max_val
    cases = [(lo + (hi - lo) / 512, (hi - lo) / 256, 256),   # torch.ao's model over the full range
             (-1.0, 0.25, 9), (0.3, 0.05, 4), (-20.0, 7.0, 8), (0.0, 0.0, 3)]  # clipping, wide, step 0
    c0 = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    step = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    for (a, s, L), got in zip(cases, [OPS.histogram_quant_error(*h._hist_args(), c0[i:i + 1], step[i:i + 1], c[2])
                                       for i, c in enumerate(cases)]):
        want = numeric_error(h, a, s, L)
        assert float(got[0]) == pytest.approx(want, rel=2e-3, abs=1e-9)
    # one call with many quantizers equals the calls one by one
    many = OPS.histogram_quant_error(*h._hist_args(), c0, step, 256)
    one = torch.cat([OPS.histogram_quant_error(*h._hist_args(), c0[i:i + 1], step[i:i + 1], 256)
                     for i in range(len(cases))])
    assert torch.equal(many, one)


def python_greedy(h, levels: int):
    """torch.ao's greedy (after caffe2's NormMinimization), transcribed plainly: O(n) scans from the
    current ends, errors from the op for each candidate range."""
    counts = h.counts.tolist()
    lower, upper = (t.tolist() for t in h.bin_bounds())
    nz = [j for j, c in enumerate(counts) if c]
    j0, j1 = nz[0], nz[-1]
    cum, s = [0.0] * len(counts), 0.0
    for j in range(len(counts)):
        s += counts[j] if j0 <= j <= j1 else 0
        cum[j] = s
    total = s

    def err(a, b):
        lo, hi = lower[a], upper[b]
        step = (hi - lo) / levels
        return float(OPS.histogram_quant_error(*h._hist_args(), torch.tensor([lo + step / 2], dtype=torch.float64),
                                               torch.tensor([step], dtype=torch.float64), levels)[0])

    alpha, beta, start, end = 0.0, 1.0, j0, j1
    best = err(j0, j1)  # (torch.ao: math.inf; ours must beat the full range)
    while alpha < beta:
        na, nb = alpha + 1e-5, beta - 1e-5
        l, r = start, end
        while l < end and cum[l] < na * total:
            l += 1
        while r > start and cum[r] > nb * total:
            r -= 1
        ns, ne = start, end
        if (l - start) > (end - r):
            ns, alpha = l, na
        else:
            ne, beta = r, nb
        if (ns, ne) == (start, end):
            continue
        e = err(ns, ne)
        if e > best:
            break
        best, start, end = e, ns, ne
    return lower[start], upper[end]


@pytest.mark.parametrize("case", ["normal", "heavy_tail", "relu", "two_spikes", "constant_plus_outlier"])
def test_search_matches_plain_transcription(case):
    g = torch.Generator().manual_seed(11)
    x = {"normal": lambda: torch.randn(20000, generator=g),
         "heavy_tail": lambda: torch.distributions.StudentT(2.0).sample((20000,)),
         "relu": lambda: torch.relu(torch.randn(20000, generator=g)) ** 2,
         "two_spikes": lambda: torch.cat([torch.full((5000,), -3.0), torch.full((5000,), 4.0),
                                          torch.randn(100, generator=g)]),
         "constant_plus_outlier": lambda: torch.cat([torch.full((10000,), 1.5), torch.tensor([40.0])])}[case]()
    for bins, levels in ((64, 16), (256, 256)):
        h = hist_of(x, bins)
        got = OPS.histogram_search_l2(*h._hist_args(), levels).tolist()
        assert got == list(python_greedy(h, levels))
        assert h.min_val <= got[0] <= got[1] <= h.max_val


def test_search_single_bin_and_constant():
    h = hist_of(torch.full((100,), -2.25), 64)
    assert OPS.histogram_search_l2(*h._hist_args(), 256).tolist() == [-2.25, -2.25]


# ----------------------------------------------------------------------------- ISA paths

ISA_CHILD = """
import torch, qbackend
import qbackend.ops
if {scalar}:
    qbackend._C.set_isa_cap(0)
ops = torch.ops.qbackend
x = torch.load({inp!r})
out = {{"level": int(qbackend._C.usable_isa())}}
for name, xx in (("f32", x), ("bf16", x.bfloat16())):
    for n in (0, 1, 7, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, x.numel()):
        out[f"mm_{{name}}_{{n}}"] = ops.finite_minmax(xx[:n])
        out[f"h_{{name}}_{{n}}"] = ops.histogram_pow2(xx[:n], -5, -300, 512)
    out[f"h0out_{{name}}"] = ops.histogram_pow2(xx, -5, 10, 512)  # the bin of 0 outside the window
    out[f"pc_{{name}}"] = ops.finite_minmax(xx[:99990].reshape(30, 3333), 1)
    out[f"pc_short_{{name}}"] = ops.finite_minmax(xx[:99990].reshape(3333, 30), 1)
torch.save(out, {outp!r})
"""


def test_isa_paths_agree():
    g = torch.Generator().manual_seed(29)  # then a ReLU-like stretch (dense zeros) and a dense-zero tail
    x = torch.cat([special_values(100_003, 23, 4.0), torch.relu(torch.randn(70_001, generator=g)), torch.zeros(77)])
    f = {k: all(v) for k, v in qbackend._C.cpu_probe().items() if isinstance(v, tuple)}
    real = 0 if not (f["avx2"] and f["fma"]) else (
        2 if all(f[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq")) else 1)
    paths = {"avx512": ({"QBACKEND_ISA": "avx512"}, False, min(real, 2)),
             "avx2": ({"QBACKEND_ISA": "avx2"}, False, min(real, 1)), "scalar": ({}, True, 0)}
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.pt")
        torch.save(x, inp)

        def run(name):
            env, scalar, _ = paths[name]
            outp = os.path.join(tmp, f"{name}.pt")
            run_py(ISA_CHILD.format(scalar=scalar, inp=inp, outp=outp), env=env, check=True)
            return torch.load(outp)

        with ThreadPoolExecutor(len(paths)) as pool:
            results = dict(zip(paths, pool.map(run, paths)))
    for name, out in results.items():
        assert min(out["level"], 2) == paths[name][2], name
    base = results["scalar"]
    want, want_out, _ = ref_histogram(x, -5, -300, 512)
    assert np.array_equal(base[f"h_f32_{x.numel()}"][0].numpy(), want)
    assert int(base[f"h_f32_{x.numel()}"][4]) == want_out
    assert tuple(float(v) for v in base[f"mm_f32_{x.numel()}"]) == tuple(float(v) for v in ref_minmax(x))
    want, want_out, _ = ref_histogram(x, -5, 10, 512)
    assert np.array_equal(base["h0out_f32"][0].numpy(), want) and int(base["h0out_f32"][4]) == want_out
    for name, out in results.items():
        for key, v in base.items():
            if key != "level":
                assert all(torch.equal(a, b) for a, b in zip(out[key], v)), (name, key)


# ----------------------------------------------------------------------------- tracing

def test_opcheck_and_fakes():
    x = special_values(500, 2)
    h = hist_of(torch.randn(1000), 64)
    c0, step = torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.tensor([0.01, 0.02], dtype=torch.float64)
    for op, args in [(OPS.finite_minmax.default, (x,)), (OPS.finite_minmax.default, (x.reshape(20, 25), 1)),
                     (OPS.histogram_pow2.default, (x, -4, -100, 256)),
                     (OPS.histogram_search_l2.default, (*h._hist_args(), 256)),
                     (OPS.histogram_quant_error.default, (*h._hist_args(), c0, step, 256))]:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        counts, mn, mx, nf, out = OPS.histogram_pow2(torch.empty(10, 3), 0, 0, 128)
        assert counts.shape == (128,) and counts.dtype == torch.int64 and mn.shape == () and out.dtype == torch.int64
        mn, mx, nf = OPS.finite_minmax(torch.empty(4, 6), -1)
        assert mn.shape == (6,) and nf.dtype == torch.int64


# ----------------------------------------------------------------------------- bad input

X = "torch.randn(100)"
H = "torch.tensor([3, 0, 5], dtype=torch.int64)"  # a histogram: bins of width 1 from bin 0
C1, S1 = "torch.tensor([0.5], dtype=torch.float64)", "torch.tensor([0.1], dtype=torch.float64)"
ERROR_CASES = {
    "finite_minmax": [
        ("x_int", "op(torch.ones(3, dtype=torch.int32))", "TypeError", "x must"),
        ("x_f64", "op(torch.ones(3, dtype=torch.float64))", "TypeError", "x must"),
        ("x_f16", "op(torch.ones(3, dtype=torch.float16))", "TypeError", "x must"),
        ("x_bool", "op(torch.ones(3, dtype=torch.bool))", "TypeError", "x must"),
        ("axis_high", f"op({X}.reshape(10, 10), 2)", "ValueError", "axis"),
        ("axis_low", f"op({X}.reshape(10, 10), -3)", "ValueError", "axis"),
        ("axis_0d", "op(torch.tensor(1.0), 0)", "ValueError", "axis"),
    ],
    "histogram_pow2": [
        ("x_int", "op(torch.ones(3, dtype=torch.int64), 0, 0, 16)", "TypeError", "x must"),
        ("log2_width", f"op({X}, 301, 0, 16)", "ValueError", "log2_width must"),
        ("log2_width_low", f"op({X}, -301, 0, 16)", "ValueError", "log2_width must"),
        ("bins_zero", f"op({X}, 0, 0, 0)", "ValueError", "bins must"),
        ("bins_huge", f"op({X}, 0, 0, 1 << 21)", "ValueError", "bins must"),
        ("offset_huge", f"op({X}, 0, 1 << 60, 16)", "ValueError", "offset must"),
        ("offset_low", f"op({X}, 0, -(1 << 60), 16)", "ValueError", "offset must"),
    ],
    "histogram_search_l2": [
        ("counts_float", "op(torch.ones(3), 0, 0, 0.0, 2.5, 256)", "TypeError", "counts must"),
        ("counts_2d", "op(torch.ones(3, 2, dtype=torch.int64), 0, 0, 0.0, 2.5, 256)", "ValueError", "counts must"),
        ("counts_empty", "op(torch.ones(0, dtype=torch.int64), 0, 0, 0.0, 2.5, 256)", "ValueError", "counts must"),
        ("counts_negative", "op(torch.tensor([3, -1, 5]), 0, 0, 0.0, 2.5, 256)", "ValueError", "non-negative"),
        ("counts_zero", "op(torch.zeros(3, dtype=torch.int64), 0, 0, 0.0, 2.5, 256)", "ValueError", "all zero"),
        ("min_gt_max", f"op({H}, 0, 0, 2.5, 0.0, 256)", "ValueError", "min <= max"),
        ("min_nan", f"op({H}, 0, 0, float('nan'), 2.5, 256)", "ValueError", "finite"),
        ("max_inf", f"op({H}, 0, 0, 0.0, float('inf'), 256)", "ValueError", "finite"),
        ("range_outside", f"op({H}, 0, 0, 0.0, 3.5, 256)", "ValueError", "does not fit"),
        ("range_below", f"op({H}, 0, 0, -0.5, 2.5, 256)", "ValueError", "does not fit"),
        ("mass_outside", f"op({H}, 0, 0, 0.0, 0.5, 256)", "ValueError", "lies outside"),
        ("levels_1", f"op({H}, 0, 0, 0.0, 2.5, 1)", "ValueError", "levels must"),
        ("levels_huge", f"op({H}, 0, 0, 0.0, 2.5, 1 << 20)", "ValueError", "levels must"),
        ("log2_width", f"op({H}, 400, 0, 0.0, 2.5, 256)", "ValueError", "log2_width must"),
    ],
    "histogram_quant_error": [
        ("c0_f32", f"op({H}, 0, 0, 0.0, 2.5, torch.tensor([0.5]), {S1}, 256)", "TypeError", "first_center must"),
        ("step_int", f"op({H}, 0, 0, 0.0, 2.5, {C1}, torch.tensor([1]), 256)", "TypeError", "step must"),
        ("shape", f"op({H}, 0, 0, 0.0, 2.5, {C1}, torch.ones(2, dtype=torch.float64), 256)", "ValueError",
         "one length"),
        ("step_negative", f"op({H}, 0, 0, 0.0, 2.5, {C1}, -{S1}, 256)", "ValueError", "step must"),
        ("step_nan", f"op({H}, 0, 0, 0.0, 2.5, {C1}, {S1} * float('nan'), 256)", "ValueError", "step must"),
        ("c0_inf", f"op({H}, 0, 0, 0.0, 2.5, {C1} * float('inf'), {S1}, 256)", "ValueError", "first_center must"),
        ("counts_negative", f"op(torch.tensor([3, -1, 5]), 0, 0, 0.0, 2.5, {C1}, {S1}, 256)", "ValueError",
         "non-negative"),
        ("levels", f"op({H}, 0, 0, 0.0, 2.5, {C1}, {S1}, 0)", "ValueError", "levels must"),
    ],
}


@pytest.fixture(scope="module")
def error_results():
    """All bad-input cases in one child process (a crash fails these tests, not pytest)."""
    return run_op_error_cases(ERROR_CASES)


@pytest.mark.parametrize("op,case,exc,text", op_error_params(ERROR_CASES),
                         ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_bad_input(error_results, op, case, exc, text):
    assert_op_error(error_results[(op, case)], exc, text)
