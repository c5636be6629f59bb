"""Property tests: every provider of the int8 Linear agrees with the fp64 reference.

PackedLinearWeight(w, w_scales, bias, provider).linear(...) and .linear_dynamic(...) for the
native (where the CPU has VNNI), fbgemm and onednn providers, against qbackend.ops.reference (exact integer sums in fp64, exact erf
gelu, round half to even).

Acceptance rule (the same in test_conv2d.py):
  * integer outputs (uint8/int8): |provider - reference| <= 1 LSB everywhere. The kernels requantize
    in fp32 and the reference in fp64, so a value at an exact .5 tie may round the other way. So
    that a systematic bias cannot hide behind that LSB: fewer than 1% of the elements may be off by
    one (at most one element in outputs of fewer than 100 elements), and every element that is off
    must be at a tie: its fp64 value, in output LSBs, lies within the fp32 tolerance below
    ((1e-5 * bound + 1e-6) / output_scale) of a .5 boundary.
  * fp32 outputs: |y - ref| <= 1e-5 * bound + 1e-6, where
        bound[m, n] = x_scale * w_scale[n] * sum_k |x[m, k] - x_zp| * |w[n, k]| + |bias[n]|
    is the magnitude of the terms (fp32 accumulation of exact int32 sums: relative error < 1e-5
    against fp64 on the same integers), computed with fp64 torch ops.
  * bf16 outputs: |y - ref| <= 2**-8 * bound + 1e-6 (bf16 rounding).
  * post_op gelu: the same rules; the reference applies exact (erf) gelu.
  * linear_dynamic (fp32 in and out): the fp32 rule against reference.linear on
    q = reference.quantize(x, *reference.choose_dynamic_qparams(x, reduce_range)); where the
    kernels' fp32 division rounds an exact .5 tie of x / scale the other way (the 1 LSB the quantize
    contract allows, see test_quantize.py), the reference takes the kernels' code.

In-process tests follow the CPU they run on: where a provider does not multiply 8-bit activations
exactly (no VNNI, or QBACKEND_ISA caps it) they use 7-bit uint8 activations, as the observers do
there, and no int8 activations. test_isa_classes runs compact linear and conv2d checks in child
processes under QBACKEND_ISA=avx2, avx512 and avx512_vnni, including the 7-bit rule's ValueErrors.
"""
from __future__ import annotations

import copy
import inspect
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qbackend
from qbackend.ops import PackedLinearWeight
from qbackend.ops import reference as R

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from subprocess_utils import json_lines  # noqa: E402

from tests.ops.numerics import (FAST, HSET, OUT_DTYPES, POST_OPS, activations, all_threads,
                                  assert_rule, error_metrics, exact_8bit, log_uniform,
                                  dynamic_reference_input, output_scale_for, weights, zero_points)

pytestmark = pytest.mark.usefixtures("one_thread")
SLOW_HSET = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def linear_bound(x, x_scale, x_zp, w, w_scales, bias):
    """bound[..., n] = x_scale * w_scale[n] * sum_k |x - x_zp| * |w[n, k]| + |bias[n]|, in fp64."""
    b = ((x.double() - int(x_zp)).abs() @ w.double().abs().t()) * R.f32(x_scale) * w_scales.float().double()
    return b if bias is None else b + bias.float().double().abs()


def check_linear(pw, x, x_scale, x_zp, span, out_zp, out_dtype, post_op, what=""):
    """Runs pw.linear and asserts the rule against the reference (reference.linear is
    quantize(linear_fp64) for integer outputs, linear_fp64 for float ones); returns the metrics.
    The output scale puts the largest |y| `span` LSBs from zero (> 127: some outputs saturate)."""
    y64 = R.linear_fp64(x, x_scale, x_zp, pw.weight, pw.w_scales, pw.bias, post_op)
    out_scale = output_scale_for(y64, span)
    what = (f"{pw.provider_name} linear x{tuple(x.shape)} {x.dtype} zp={x_zp} scale={x_scale:.4g} -> "
            f"{out_dtype} (scale={out_scale:.4g}, zp={out_zp}) post_op={post_op} bias={pw.bias is not None} {what}")
    y = pw.linear(x, x_scale, x_zp, out_scale, out_zp, out_dtype, post_op)
    shape = (*x.shape[:-1], pw.out_features)
    assert y.dtype == out_dtype and tuple(y.shape) == shape, f"{what}: got {y.dtype} {tuple(y.shape)}"
    m = error_metrics(y, y64, linear_bound(x, x_scale, x_zp, pw.weight, pw.w_scales, pw.bias), out_dtype,
                      out_scale, out_zp)
    assert_rule(m, what)
    return m


# ----------------------------------------------------------------------------- inputs

@st.composite
def linear_cases(draw, provider):
    exact = exact_8bit(provider)
    c = {
        "m": draw(st.one_of(st.just(1), st.integers(1, 70))),
        "k": draw(st.one_of(st.sampled_from([1, 3, 67, 129]), st.integers(1, 160))),
        "n": draw(st.one_of(st.sampled_from([1, 3, 17, 33]), st.integers(1, 48))),
        "lead": draw(st.sampled_from([(), (), (2,), (3,)])),  # x [*lead, m, k]: 3-D input
        "x_dtype": draw(st.sampled_from([torch.uint8, torch.int8] if exact else [torch.uint8])),
        "x_mode": draw(st.sampled_from(["full", "ends", "near_zp"])),
        "w_mode": draw(st.sampled_from(["full", "ends", "sparse"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "x_scale": R.f32(10 ** draw(st.floats(-3, 0))),
        "bias": draw(st.sampled_from([None, 1e-3, 1.0, 100.0])),
        "out_dtype": draw(st.sampled_from(OUT_DTYPES)),
        "post_op": draw(st.sampled_from(POST_OPS)),
        "span": draw(st.sampled_from([20.0, 100.0, 400.0])),  # |y|max in output LSBs (>127: saturates)
        "x_shape_hint": draw(st.sampled_from(["none", "actual", "other"])),
    }
    c["x_zp"] = draw(zero_points(c["x_dtype"]))
    c["out_zp"] = draw(zero_points(c["out_dtype"] if c["out_dtype"] in R.QRANGE else torch.uint8))
    return c


def build_linear(c, provider):
    g = torch.Generator().manual_seed(c["seed"])
    x = activations((*c["lead"], c["m"], c["k"]), c["x_dtype"], c["x_zp"], c["x_mode"],
                    not exact_8bit(provider), g)
    w = weights((c["n"], c["k"]), c["w_mode"], g)
    ws = log_uniform(g, c["n"], -4, -1)
    bias = None if c["bias"] is None else torch.randn(c["n"], generator=g) * c["bias"]
    hint = {"none": None, "actual": list(x.shape), "other": [5, c["k"]]}[c["x_shape_hint"]]
    return x, PackedLinearWeight(w, ws, bias, provider, x_shape=hint)


# ----------------------------------------------------------------------------- static linear

def run_linear_case(provider, c):
    x, pw = build_linear(c, provider)
    check_linear(pw, x, c["x_scale"], c["x_zp"], c["span"], c["out_zp"], c["out_dtype"], c["post_op"], str(c))


@pytest.mark.parametrize("provider", FAST)
@HSET
@given(data=st.data())
def test_linear_matches_reference(provider, data):
    run_linear_case(provider, data.draw(linear_cases(provider)))


@pytest.mark.slow
@pytest.mark.parametrize("provider", FAST)
@SLOW_HSET
@given(data=st.data())
def test_linear_matches_reference_sweep(provider, data):
    run_linear_case(provider, data.draw(linear_cases(provider)))


@pytest.mark.parametrize("provider", FAST)
def test_linear_every_combination_small(provider):
    """Every activation dtype x zero point end x output dtype x post-op x bias, on one small shape
    (M=3, K=67, N=5), so no combination depends on what hypothesis happens to draw."""
    exact = exact_8bit(provider)
    g = torch.Generator().manual_seed(3)
    w = weights((5, 67), "full", g)
    ws = log_uniform(g, 5, -3, -2)
    failures = []
    for x_dtype in ([torch.uint8, torch.int8] if exact else [torch.uint8]):
        lo, hi = R.QRANGE[x_dtype]
        x = activations((3, 67), x_dtype, 0, "full", not exact, g)
        for x_zp in (lo, hi):
            for bias in (None, torch.randn(5, generator=g)):
                pw = PackedLinearWeight(w, ws, bias, provider)
                for post_op in POST_OPS:
                    for out_dtype in OUT_DTYPES:
                        olo, ohi = R.QRANGE.get(out_dtype, (0, 0))
                        for out_zp in sorted({olo, (olo + ohi + 1) // 2, ohi}):
                            try:
                                check_linear(pw, x, 0.05, x_zp, 100.0, out_zp, out_dtype, post_op)
                            except AssertionError as e:  # collect, then fail with all of them
                                failures.append(str(e).splitlines()[0][:300])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


@pytest.mark.parametrize("provider", FAST)
def test_linear_large_multithreaded(provider):
    """Large enough for the providers' multi-task paths (FBGEMM splits from M*N*K >= 2**22); the
    off-by-one fraction is measured on many elements here."""
    exact = exact_8bit(provider)
    g = torch.Generator().manual_seed(5)
    x = activations((2, 64, 300), torch.uint8, 0, "full", not exact, g)
    w = weights((130, 300), "full", g)
    ws = log_uniform(g, 130, -4, -2)
    pw = PackedLinearWeight(w, ws, torch.randn(130, generator=g), provider)
    with all_threads():
        for post_op in POST_OPS:
            for out_dtype in OUT_DTYPES:
                check_linear(pw, x, 0.02, 131, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, post_op)


@pytest.mark.parametrize("provider", FAST)
def test_linear_empty_m(provider):
    w = torch.randint(-127, 128, (7, 13), dtype=torch.int8)
    pw = PackedLinearWeight(w, torch.full((7,), 0.01), torch.randn(7), provider)
    x_dtypes = [torch.uint8, torch.int8] if exact_8bit(provider) else [torch.uint8]
    for shape in [(0, 13), (2, 0, 13), (0, 3, 13)]:
        for x_dtype in x_dtypes:
            for out_dtype in OUT_DTYPES:
                y = pw.linear(torch.zeros(shape, dtype=x_dtype), 0.1, 0, 0.1, 0, out_dtype, "relu")
                assert y.dtype == out_dtype and tuple(y.shape) == (*shape[:-1], 7)
        y = pw.linear_dynamic(torch.zeros(shape), reduce_range=True)
        assert y.dtype == torch.float32 and tuple(y.shape) == (*shape[:-1], 7)


def test_reference_provider_is_reference_linear():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 4, 9), generator=g, dtype=torch.uint8)
    w = weights((6, 9), "full", g)
    ws, bias = log_uniform(g, 6, -3, -1), torch.randn(6, generator=g)
    pw = PackedLinearWeight(w, ws, bias, "reference")
    for out_dtype in OUT_DTYPES:
        for post_op in POST_OPS:
            y = pw.linear(x, 0.03, 17, 0.05, 3, out_dtype, post_op)
            ref = R.linear(x, 0.03, 17, w, ws, bias, 0.05, 3, out_dtype, post_op)
            assert torch.equal(y, ref if out_dtype in R.QRANGE else ref.to(out_dtype))
    xf = torch.randn(3, 9, generator=g)
    s, z = R.choose_dynamic_qparams(xf, True)
    assert torch.equal(pw.linear_dynamic(xf, reduce_range=True),
                       R.linear(R.quantize(xf, s, z, torch.uint8), s, z, w, ws, bias).float())


# ----------------------------------------------------------------------------- dynamic linear

@pytest.mark.parametrize("provider", FAST)
@HSET
@given(m=st.one_of(st.just(1), st.integers(1, 70)), k=st.one_of(st.sampled_from([1, 3, 67, 129]),
       st.integers(1, 160)), n=st.one_of(st.just(1), st.integers(1, 40)), lead=st.sampled_from([(), (2,)]),
       seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["mixed", "positive", "negative", "zeros", "spiky"]),
       mag=st.sampled_from([1e-3, 1.0, 50.0]), reduce_range=st.booleans(), bias=st.booleans(),
       post_op=st.sampled_from(POST_OPS))
def test_linear_dynamic_matches_reference(provider, m, k, n, lead, seed, kind, mag, reduce_range, bias, post_op):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((*lead, m, k), generator=g) * mag
    if kind == "positive":
        x = x.abs() + mag
    elif kind == "negative":
        x = -x.abs() - mag
    elif kind == "zeros":
        x = torch.zeros_like(x)
    elif kind == "spiky":
        x.view(-1)[0] = 1000 * mag
    w = weights((n, k), "full", g)
    ws = log_uniform(g, n, -4, -1)
    b = torch.randn(n, generator=g) if bias else None
    pw = PackedLinearWeight(w, ws, b, provider)
    if not reduce_range and not exact_8bit(provider):
        with pytest.raises(ValueError, match="reduce_range"):
            pw.linear_dynamic(x, reduce_range=False, post_op=post_op)
        return
    y = pw.linear_dynamic(x, reduce_range=reduce_range, post_op=post_op)
    assert y.dtype == torch.float32 and tuple(y.shape) == (*lead, m, n)
    x2 = x.reshape(-1, k)  # the dynamic qparams cover all of x
    q, s, z = dynamic_reference_input(x2, reduce_range)
    y64 = R.linear(q, s, z, w, ws, b, post_op=post_op).reshape(*lead, m, n)
    bound = linear_bound(q, s, z, w, ws, b).reshape(*lead, m, n)
    assert_rule(error_metrics(y, y64, bound, torch.float32),
                f"{provider} linear_dynamic x{tuple(x.shape)} {kind} mag={mag} reduce_range={reduce_range} "
                f"bias={bias} post_op={post_op}")


@pytest.mark.parametrize("provider", FAST)
def test_linear_dynamic_default_reduce_range(provider):
    """reduce_range=None picks 7 bits exactly where the provider would saturate 8-bit products."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 33, generator=g)
    pw = PackedLinearWeight(weights((9, 33), "full", g), log_uniform(g, 9, -3, -2), None, provider)
    expected = pw.linear_dynamic(x, reduce_range=not exact_8bit(provider))
    assert torch.equal(pw.linear_dynamic(x), expected)


# ----------------------------------------------------------------------------- packed weights

@pytest.mark.parametrize("provider", FAST)
def test_linear_pickle_deepcopy_with_provider(provider):
    exact = exact_8bit(provider)
    g = torch.Generator().manual_seed(4)
    x = activations((2, 5, 67), torch.uint8, 0, "full", not exact, g)
    xf = torch.randn(4, 67, generator=g)
    pw = PackedLinearWeight(weights((19, 67), "full", g), log_uniform(g, 19, -3, -1),
                            torch.randn(19, generator=g), provider)
    copies = [pickle.loads(pickle.dumps(pw)), copy.deepcopy(pw)]
    for out_dtype, post_op in [(torch.uint8, "relu"), (torch.int8, "none"), (torch.float32, "gelu"),
                               (torch.bfloat16, "none")]:
        y = pw.linear(x, 0.02, 100, 0.05, 10, out_dtype, post_op)
        for cp in copies:
            assert cp.provider_name == provider and cp.packed is not pw.packed
            assert torch.equal(cp.linear(x, 0.02, 100, 0.05, 10, out_dtype, post_op), y)
    for cp in copies:
        assert torch.equal(cp.linear_dynamic(xf, reduce_range=True), pw.linear_dynamic(xf, reduce_range=True))
    for other in FAST + ["reference"]:
        moved = pw.with_provider(other)
        assert moved.provider_name == other and pw.provider_name == provider
        xo = x if exact_8bit(other) else x.clamp(max=127)
        for out_dtype in OUT_DTYPES:
            check_linear(moved, xo, 0.02, 100, 100.0, 10, out_dtype, "relu", f"(with_provider from {provider})")


# ----------------------------------------------------------------------------- ISA classes (child processes)

# The compact checks a child runs under one QBACKEND_ISA; prints one JSON line per result.
ISA_CHILD = r"""
import json, torch
import torch.nn.functional as F
import qbackend
from qbackend.ops import PROVIDERS, PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import reference as R

torch.set_num_threads(1)

{helpers}

def emit(**kw):
    print(json.dumps(kw), flush=True)

def conv_bound(x, xs, xzp, w, ws, b, stride, padding, groups):
    t = F.conv2d((x.double() - xzp).abs(), w.double().abs(), None, stride, padding, 1, groups)
    return t * R.f32(xs) * ws.double().reshape(1, -1, 1, 1) + b.double().abs().reshape(1, -1, 1, 1)

def attempt(fn):
    try:
        return fn(), None, ""
    except Exception as e:
        return None, type(e).__name__, str(e)[:300]

def check(op, p, case, x, zp, od, run, y64, bound, **extra):
    os_ = R.f32(max(float(y64.abs().max()), 1e-3) / 100 * 1.0731)
    y, err, msg = attempt(lambda: run(os_))
    if y is None:
        emit(kind="check", op=op, provider=p, case=case, out=str(od), error=err, msg=msg, **extra)
        return
    emit(kind="check", op=op, provider=p, case=case, out=str(od), dtype=str(y.dtype), max_x=int(x.max()),
         channels_last=y.dim() != 4 or y.is_contiguous(memory_format=torch.channels_last),
         **extra, **error_metrics(y, y64, bound, od, os_, 128))

exact = {{p: PROVIDERS[p].exact_8bit() for p in ("fbgemm", "onednn")}}
emit(kind="info", level=int(qbackend._C.usable_isa()), fbgemm_isa=qbackend._C.fbgemm_isa(), exact=exact)
g = torch.Generator().manual_seed(0)
for p in ("fbgemm", "onednn"):
    full = exact[p]
    hi = 255 if full else 127
    for m, k, n in [(1, 67, 5), (17, 129, 33), (4, 3, 1)]:
        w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
        ws = torch.rand(n, generator=g) * 0.01 + 1e-3
        b = torch.randn(n, generator=g)
        pw = PackedLinearWeight(w, ws, b, p)
        xs = [("uint8", torch.randint(0, hi + 1, (m, k), generator=g).to(torch.uint8), 200 if full else 60)]
        if full:
            xs.append(("int8", torch.randint(-128, 128, (m, k), generator=g).to(torch.int8), -100))
        for xname, x, zp in xs:
            y64 = R.linear_fp64(x, 0.02, zp, w, ws, b)
            bound = linear_bound(x, 0.02, zp, w, ws, b)
            for od in (torch.uint8, torch.float32):
                check("linear", p, f"{{m}}x{{k}}x{{n}} {{xname}} zp={{zp}}", x, zp, od,
                      lambda os_: pw.linear(x, 0.02, zp, os_, 128, od, "none"), y64, bound)
        if not full:
            x200 = torch.randint(0, 128, (m, k), generator=g).to(torch.uint8)
            x200.view(-1)[-1] = 200
            _, t, msg = attempt(lambda: pw.linear(x200, 0.02, 60, 0.1, 128, torch.uint8, "none"))
            emit(kind="raises", op="linear", provider=p, x="uint8 with 200", type=t, msg=msg)
            xi = torch.randint(-5, 5, (m, k), generator=g).to(torch.int8)
            _, t, msg = attempt(lambda: pw.linear(xi, 0.02, 0, 0.1, 128, torch.uint8, "none"))
            emit(kind="raises", op="linear", provider=p, x="int8", type=t, msg=msg)
    # N, IC, OC, H, W, kernel, stride, padding, groups: dense, depthwise, stem, grouped, pointwise
    for nb, ic, oc, h, wd, kk, st, pd, gr in [(1, 5, 17, 9, 7, 3, 1, 1, 1), (2, 8, 8, 9, 11, 3, 1, 1, 8),
                                              (1, 3, 8, 15, 13, 7, 2, 3, 1), (1, 8, 8, 9, 9, 3, 1, 1, 4),
                                              (2, 17, 5, 7, 5, 1, 1, 0, 1)]:
        w = torch.randint(-127, 128, (oc, ic // gr, kk, kk), generator=g).to(torch.int8)
        ws = torch.rand(oc, generator=g) * 0.01 + 1e-3
        b = torch.randn(oc, generator=g)
        pw = PackedConv2dWeight(w, ws, b, st, pd, 1, gr, p)
        x = torch.randint(0, hi + 1, (nb, ic, h, wd), generator=g).to(torch.uint8)
        x = x.contiguous(memory_format=torch.channels_last)
        case = f"{{nb}}x{{ic}}x{{h}}x{{wd}} -> {{oc}} k{{kk}} s{{st}} p{{pd}} g{{gr}}"
        # zp 200 with padding: the padded value is 200 even when x holds 7-bit values
        for zp in ((200, 128, 0) if pd else (200,)) if full else (60, 200):
            y64 = R.conv2d_fp64(x, 0.02, zp, w, ws, b, pw.stride, pw.padding, pw.dilation, gr)
            bound = conv_bound(x, 0.02, zp, w, ws, b, pw.stride, pw.padding, gr)
            for od in (torch.uint8, torch.float32):
                check("conv2d", p, case + f" zp={{zp}}", x, zp, od,
                      lambda os_: pw.conv2d(x, 0.02, zp, os_, 128, od, "none"), y64, bound, padded_zp=zp)
        # oneDNN's depthwise convs are exact at 8 bits on every ISA: they take 8-bit x without VNNI too
        if not full and not PROVIDERS[p].exact_8bit("conv2d", {{"groups": gr, "c_in": ic, "c_out": oc}}):
            x200 = x.clone()
            x200[0, 0, 0, 0] = 200
            _, t, msg = attempt(lambda: pw.conv2d(x200, 0.02, 60, 0.1, 128, torch.uint8, "none"))
            emit(kind="raises", op="conv2d", provider=p, x="uint8 with 200", type=t, msg=msg)
            xi = torch.randint(-5, 5, x.shape, generator=g).to(torch.int8)
            _, t, msg = attempt(lambda: pw.conv2d(xi, 0.02, 0, 0.1, 128, torch.uint8, "none"))
            emit(kind="raises", op="conv2d", provider=p, x="int8", type=t, msg=msg)
    if full:  # 7-bit activations with a zero point above 127 (padding holds it), on the fast routes too
        for ic, oc, gr in [(8, 8, 8), (8, 16, 8), (5, 17, 1)]:
            w = torch.randint(-127, 128, (oc, ic // gr, 3, 3), generator=g).to(torch.int8)
            ws = torch.rand(oc, generator=g) * 0.01 + 1e-3
            b = torch.randn(oc, generator=g)
            pw = PackedConv2dWeight(w, ws, b, 1, 1, 1, gr, p)
            x = torch.randint(0, 128, (1, ic, 9, 9), generator=g).to(torch.uint8)
            x = x.contiguous(memory_format=torch.channels_last)
            y64 = R.conv2d_fp64(x, 0.02, 200, w, ws, b, pw.stride, pw.padding, pw.dilation, gr)
            bound = conv_bound(x, 0.02, 200, w, ws, b, pw.stride, pw.padding, gr)
            for od in (torch.uint8, torch.float32):
                check("conv2d", p, f"1x{{ic}}x9x9 -> {{oc}} k3 s1 p1 g{{gr}} 7-bit x zp=200", x, 200, od,
                      lambda os_: pw.conv2d(x, 0.02, 200, os_, 128, od, "none"), y64, bound, padded_zp=200)
"""


def _host_level() -> int:
    ok = {k: all(v) for k, v in qbackend._C.cpu_probe().items() if isinstance(v, tuple)}
    if not (ok["avx2"] and ok["fma"]):
        return 0
    if not all(ok[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        return 1
    return 3 if ok["avx512_vnni"] else 2


ISA_LEVEL = {"avx2": 1, "avx512": 2, "avx512_vnni": 3}


def _isa_problems(isa, lines):
    """Everything wrong in one child's report, as messages (all of them, not just the first)."""
    problems = []
    info = [r for r in lines if r["kind"] == "info"]
    checks = [r for r in lines if r["kind"] == "check"]
    errors = [r for r in lines if r["kind"] == "raises"]
    vnni = ISA_LEVEL[isa] >= 3
    if len(info) != 1 or info[0]["level"] != ISA_LEVEL[isa] or info[0]["exact"] != {"fbgemm": vnni, "onednn": vnni}:
        return [f"QBACKEND_ISA={isa}: the child did not run at that ISA: {info}"]
    # per provider: linear 3 shapes x (uint8 [+ int8]) x 2 outputs; conv 5 shapes x zero points x 2 outputs
    expected = 2 * (3 * (2 if vnni else 1) * 2 + (4 * 3 + 1 + 3 if vnni else 5 * 2) * 2)
    if len(checks) != expected:
        problems.append(f"QBACKEND_ISA={isa}: {len(checks)} checks reported, expected {expected}")
    for r in checks:
        what = f"QBACKEND_ISA={isa} {r['provider']} {r['op']} {r['case']} -> {r['out']}"
        if "error" in r:
            # without VNNI, refusing a zero point above 127 that padding would feed to the kernel is fine
            if not (not vnni and r.get("padded_zp", 0) > 127 and r["error"] == "ValueError"):
                problems.append(f"{what}: raised {r['error']}: {r['msg']}")
            continue
        if r["dtype"] != r["out"]:
            problems.append(f"{what}: returned {r['dtype']}")
        if not r["channels_last"]:
            problems.append(f"{what}: output is not channels-last")
        try:
            assert_rule(r, what)
        except AssertionError as e:
            problems.append(str(e).splitlines()[0])
    if vnni:
        if errors:
            problems.append(f"QBACKEND_ISA={isa}: unexpected refusals {errors}")
        if not any(r.get("max_x", 0) > 127 for r in checks):
            problems.append(f"QBACKEND_ISA={isa}: full-range activations were not exercised")
    else:
        if any(r.get("max_x", 0) > 127 for r in checks):
            problems.append(f"QBACKEND_ISA={isa}: 8-bit activations in a 7-bit run")
        # 2 providers x (3 linear + 5 conv cases) x 2 inputs, less oneDNN's depthwise conv (exact at 8 bits)
        expected = 2 * (3 + 5) * 2 - 2
        if len(errors) != expected:
            problems.append(f"QBACKEND_ISA={isa}: {len(errors)} refusal checks reported, expected {expected}")
        for r in errors:
            what = f"QBACKEND_ISA={isa} {r['provider']} {r['op']} x={r['x']}: {r['type']}: {r['msg']}"
            if r["type"] != "ValueError" or (r["x"] == "uint8 with 200" and "127" not in r["msg"]):
                problems.append(what)
    return problems


def test_isa_classes():
    """Compact linear + conv2d checks under QBACKEND_ISA=avx2 / avx512 / avx512_vnni, concurrently.

    Without VNNI both providers take only 7-bit uint8 activations: x in [0, 127] must be within the
    rule (a conv whose padding feeds the kernel a zero point above 127 may instead raise ValueError),
    while a uint8 x holding 200 and any int8 x must raise ValueError (the first mentioning 127).
    With avx512_vnni, full-range uint8 and int8 activations must be within the rule."""
    host = _host_level()
    isas = [name for name, level in ISA_LEVEL.items() if level <= host]
    if not isas:
        pytest.skip("this CPU has no AVX2")
    code = ISA_CHILD.format(helpers=inspect.getsource(error_metrics) + "\n" + inspect.getsource(linear_bound))
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")}
    procs = {isa: subprocess.Popen([sys.executable, "-c", code], env={**env, "QBACKEND_ISA": isa},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for isa in isas}
    problems = []
    try:
        for isa, proc in procs.items():
            out, err = proc.communicate(timeout=180)
            if proc.returncode != 0:
                how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                       else f"exited with status {proc.returncode}")
                problems.append(f"QBACKEND_ISA={isa} child {how}\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
                continue
            problems += _isa_problems(isa, json_lines(subprocess.CompletedProcess(proc.args, 0, out, err)))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
