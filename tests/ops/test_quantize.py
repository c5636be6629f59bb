"""Tests of torch.ops.qbackend.{quantize,dequantize}_per_{tensor,channel} and their wrappers.

Two oracles: an exact fp32 model in numpy (IEEE float32 division, rint, NaN -> zero point) that
the kernels must match bit for bit, and the fp64 contract in qbackend.ops.reference, which may
differ by 1 LSB where the fp32 division rounds across a .5 tie. torch's own quantization is an
independent peer. ISA paths and bad inputs run in child processes.
"""
from __future__ import annotations

import os
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import qbackend
from qbackend.ops import dequantize, quantize
from qbackend.ops import reference as R

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from subprocess_utils import assert_op_error, op_error_params, run_op_error_cases, run_py  # noqa: E402

OPS = torch.ops.qbackend
QDTYPES = [torch.uint8, torch.int8]
HSET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- oracles

def _view(v, ndim, axis):
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def model_quantize(x, scale, zp, dtype, axis=None):
    """Exact fp32 model of the kernels, in numpy (int64 result)."""
    qmin, qmax = R.QRANGE[dtype]
    xs = x.float().numpy()
    if axis is None:
        s, z = np.float32(scale), np.int64(zp)
    else:
        s = _view(scale.float().numpy(), x.dim(), axis)
        z = _view(zp.long().numpy(), x.dim(), axis)
    with np.errstate(all="ignore"):
        v = (xs / s).astype(np.float32)
    v = np.where(np.isnan(v), np.float32(0), v)
    r = np.rint(v).astype(np.float64) + z
    return torch.from_numpy(np.asarray(np.clip(r, qmin, qmax), dtype=np.int64))


def ref_quantize(x, scale, zp, dtype, axis=None):
    """The fp64 contract, with NaN mapped to the zero point (our documented choice)."""
    x = torch.where(torch.isnan(x), torch.zeros_like(x), x)
    return R.quantize(x, scale, zp, dtype, axis).long()


def dense_layout_ok(out, inp, axis=None) -> bool:
    """The ops' layout contract: contiguous output, except that the per-tensor ops keep a 4-D
    channels-last input's layout (an input can be channels-last and not contiguous when some
    dimensions have size 1: hypothesis found [1, 2, 1, 2] transposed)."""
    if axis is None and inp.dim() == 4 and inp.is_contiguous(memory_format=torch.channels_last):
        return out.is_contiguous(memory_format=torch.channels_last)
    return out.is_contiguous()


def check_quantized(q, x, scale, zp, dtype, axis=None, max_mismatch=None):
    assert q.dtype == dtype and q.shape == x.shape and dense_layout_ok(q, x, axis)
    model = model_quantize(x, scale, zp, dtype, axis)
    assert torch.equal(q.long(), model)
    if q.numel():
        diff = (q.long() - ref_quantize(x, scale, zp, dtype, axis)).abs()
        assert diff.max() <= 1
        if max_mismatch is not None:
            assert (diff > 0).double().mean() < max_mismatch


def check_dequantized(y, q, scale, zp, out_dtype, axis=None):
    assert y.dtype == out_dtype and y.shape == q.shape and dense_layout_ok(y, q, axis)
    expected = R.dequantize(q, scale, zp, axis).float().to(out_dtype)  # exact product, rounded once
    assert torch.equal(y, expected)


# ----------------------------------------------------------------------------- inputs

def with_layout(x, layout):
    """The same values as x in another memory layout."""
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "strided" and x.dim() >= 1:
        big = torch.zeros(*x.shape[:-1], x.shape[-1] * 2, dtype=x.dtype)
        big[..., ::2] = x
        return big[..., ::2]
    return x


def random_input(shape, seed, mag, in_dtype, scale=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * mag
    if scale is not None and x.numel():  # plant exact .5 ties of x / scale
        k = torch.randint(-300, 300, shape, generator=g).float() + 0.5
        x = torch.where(torch.rand(shape, generator=g) < 0.3, k * scale, x)
    return x.to(in_dtype)


qdtypes = st.sampled_from(QDTYPES)
in_dtypes = st.sampled_from([torch.float32, torch.bfloat16])
layouts = st.sampled_from(["contiguous", "transposed", "strided"])
scales = st.floats(1e-4, 100.0).map(R.f32)


@st.composite
def zero_points(draw, dtype):
    qmin, qmax = R.QRANGE[dtype]
    return draw(st.one_of(st.sampled_from([qmin, qmax]), st.integers(qmin, qmax)))


shapes = st.lists(st.integers(0, 40), min_size=0, max_size=4).filter(lambda s: int(np.prod(s)) <= 5000)


# ----------------------------------------------------------------------------- per-tensor quantize

@HSET
@given(x=arrays(np.float32, st.integers(0, 100), elements=st.floats(width=32)), scale=scales,
       dtype=qdtypes, data=st.data())
def test_quantize_special_values(x, scale, dtype, data):
    """Arbitrary float32 values incl. NaN, +-inf, subnormals, huge: exact vs the fp32 model."""
    zp = data.draw(zero_points(dtype))
    xt = torch.tensor(x)
    check_quantized(OPS.quantize_per_tensor(xt, scale, zp, dtype), xt, scale, zp, dtype)


@HSET
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), mag=st.sampled_from([0.1, 3.0, 1000.0]), scale=scales,
       dtype=qdtypes, in_dtype=in_dtypes, layout=layouts, data=st.data())
def test_quantize_per_tensor(shape, seed, mag, scale, dtype, in_dtype, layout, data):
    zp = data.draw(zero_points(dtype))
    x = with_layout(random_input(shape, seed, mag, in_dtype, scale), layout)
    check_quantized(OPS.quantize_per_tensor(x, scale, zp, dtype), x, scale, zp, dtype)


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantize_large_vs_reference(dtype, in_dtype):
    """Multi-threaded sizes; mismatches vs the fp64 contract are rare ties only (for float32 x:
    bf16 x has 8 mantissa bits, so x / scale lands near a .5 tie often, e.g. x = 0.5, scale = 1/3)."""
    for scale in (0.01, 0.037, 1 / 3):
        x = random_input((1000, 1031), 7, 2.0, in_dtype)
        zp = 128 if dtype == torch.uint8 else 0
        check_quantized(OPS.quantize_per_tensor(x, scale, zp, dtype), x, scale, zp, dtype,
                        max_mismatch=1e-3 if in_dtype == torch.float32 else None)


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("shape", [(1, 3, 224, 224), (3, 3, 7, 33), (2, 4, 9, 48), (2, 1, 6, 20), (1, 5, 3, 17),
                                   (2, 3, 0, 4)])
def test_quantize_into_channels_last(shape, dtype, in_dtype):
    """memory_format=torch.channels_last: a channels-first image quantized straight into a
    channels-last output has the values of quantizing it as it is; the other formats keep to
    their contracts (contiguous_format: contiguous even from a channels-last input)."""
    zp = 128 if dtype == torch.uint8 else -3
    x = random_input(shape, 5, 3.0, in_dtype)
    q = OPS.quantize_per_tensor(x, 0.02, zp, dtype, torch.channels_last)
    assert q.is_contiguous(memory_format=torch.channels_last) and q.shape == x.shape
    check_quantized(q.contiguous(), x, 0.02, zp, dtype)
    for xx in (x, x.contiguous(memory_format=torch.channels_last)):
        assert torch.equal(OPS.quantize_per_tensor(xx, 0.02, zp, dtype, torch.channels_last), q)
        c = OPS.quantize_per_tensor(xx, 0.02, zp, dtype, torch.contiguous_format)
        assert c.is_contiguous() and torch.equal(c, q)
        assert torch.equal(OPS.quantize_per_tensor(xx, 0.02, zp, dtype, torch.preserve_format),
                           OPS.quantize_per_tensor(xx, 0.02, zp, dtype))
    torch.library.opcheck(OPS.quantize_per_tensor.default, (x, 0.02, zp, dtype, torch.channels_last))


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("n", [1, 5, 16, 33, 100])
def test_nan_inf(dtype, n):
    qmin, qmax = R.QRANGE[dtype]
    for zp in (qmin, qmax, 3):
        for in_dtype in (torch.float32, torch.bfloat16):
            x = torch.full((n,), 1.0)
            x[0::3], x[1::3], x[2::3] = float("nan"), float("inf"), -float("inf")
            q = OPS.quantize_per_tensor(x.to(in_dtype), 0.5, zp, dtype).long()
            assert (q[0::3] == zp).all() and (q[1::3] == qmax).all() and (q[2::3] == qmin).all()


@pytest.mark.parametrize("dtype", QDTYPES)
def test_round_half_to_even_and_saturation(dtype):
    qmin, qmax = R.QRANGE[dtype]
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e6, -1e6] * 5)
    q = OPS.quantize_per_tensor(x, 1.0, 0 if dtype == torch.int8 else 10, dtype).long()
    z = 0 if dtype == torch.int8 else 10
    assert q[:6].tolist() == [z + 0, z + 2, z + 2, z + 0, z - 2, z - 2] and q[6] == qmax and q[7] == qmin


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (1, 1, 1)])
def test_empty_and_0d(shape):
    for in_dtype in (torch.float32, torch.bfloat16):
        x = torch.full(shape, 1.26, dtype=in_dtype)
        q = OPS.quantize_per_tensor(x, 0.1, 3, torch.uint8)
        assert q.shape == x.shape and q.dtype == torch.uint8
        check_quantized(q, x, 0.1, 3, torch.uint8)
        for out_dtype in (torch.float32, torch.bfloat16):
            check_dequantized(OPS.dequantize_per_tensor(q, 0.1, 3, out_dtype), q, 0.1, 3, out_dtype)
    if len(shape) >= 1:
        x = torch.ones(shape)
        s, z = torch.full((shape[0],), 0.5), torch.zeros(shape[0], dtype=torch.int32)
        q = OPS.quantize_per_channel(x, s, z, 0, torch.int8)
        assert q.shape == x.shape and q.dtype == torch.int8
        y = OPS.dequantize_per_channel(q, s, z, 0, torch.bfloat16)
        assert y.shape == x.shape and y.dtype == torch.bfloat16


# ----------------------------------------------------------------------------- per-tensor dequantize

@HSET
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-30, 1e30).map(R.f32),
       dtype=qdtypes, out_dtype=in_dtypes, layout=layouts, data=st.data())
def test_dequantize_per_tensor(shape, seed, scale, dtype, out_dtype, layout, data):
    zp = data.draw(zero_points(dtype))
    qmin, qmax = R.QRANGE[dtype]
    q = torch.randint(qmin, qmax + 1, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    q = with_layout(q, layout)
    check_dequantized(OPS.dequantize_per_tensor(q, scale, zp, out_dtype), q, scale, zp, out_dtype)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_dequantize_every_code(dtype):
    qmin, qmax = R.QRANGE[dtype]
    q = torch.arange(qmin, qmax + 1).to(dtype).repeat(3)
    for zp in (qmin, qmax, 0 if dtype == torch.int8 else 128):
        for scale in (1e-3, 0.1, 1 / 3, 3e38):  # 3e38 overflows to inf: same as torch's fp32 math
            for out_dtype in (torch.float32, torch.bfloat16):
                check_dequantized(OPS.dequantize_per_tensor(q, scale, zp, out_dtype), q, scale, zp, out_dtype)
    assert OPS.dequantize_per_tensor(q, 0.5, 0).dtype == torch.float32  # schema default out_dtype=float


# ----------------------------------------------------------------------------- per-channel

@st.composite
def channel_case(draw):
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim))
    if draw(st.booleans()):  # a long run somewhere: exercises the per-run path
        shape[draw(st.integers(0, ndim - 1))] = draw(st.integers(60, 200))
    axis = draw(st.integers(-ndim, ndim - 1))
    dtype = draw(qdtypes)
    c = shape[axis]
    s = draw(st.lists(scales, min_size=c, max_size=c))
    z = draw(st.lists(zero_points(dtype), min_size=c, max_size=c))
    return shape, axis, dtype, torch.tensor(s, dtype=torch.float32), torch.tensor(z, dtype=torch.int64)


@HSET
@given(case=channel_case(), seed=st.integers(0, 2**31 - 1), mag=st.sampled_from([0.1, 10.0, 1000.0]),
       in_dtype=in_dtypes, out_dtype=in_dtypes, layout=layouts)
def test_per_channel(case, seed, mag, in_dtype, out_dtype, layout):
    shape, axis, dtype, s, z = case
    x = with_layout(random_input(shape, seed, mag, in_dtype), layout)
    q = OPS.quantize_per_channel(x, s, z, axis, dtype)
    check_quantized(q, x, s, z, dtype, axis)
    check_dequantized(OPS.dequantize_per_channel(with_layout(q, layout), s, z, axis, out_dtype), q, s, z,
                      out_dtype, axis)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_per_channel_large_every_axis(axis):
    """Both kernel paths (long runs / expanded parameters), threads, every axis."""
    x = random_input((40, 30, 100), 3, 5.0, torch.float32)
    c = x.shape[axis]
    g = torch.Generator().manual_seed(axis + 10)
    s = (torch.rand(c, generator=g) * 0.1 + 1e-3)
    for dtype in QDTYPES:
        qmin, qmax = R.QRANGE[dtype]
        z = torch.randint(qmin, qmax + 1, (c,), generator=g)
        z[0], z[-1] = qmin, qmax
        q = OPS.quantize_per_channel(x, s, z, axis, dtype)
        check_quantized(q, x, s, z, dtype, axis, max_mismatch=1e-3)
        check_dequantized(OPS.dequantize_per_channel(q, s, z, axis, torch.float32), q, s, z, torch.float32, axis)


def test_per_channel_param_dtypes():
    """float64 scales are rounded to float32; any integer dtype of zero points works."""
    x = random_input((5, 37), 1, 3.0, torch.float32)
    s64 = torch.rand(37, dtype=torch.float64) * 0.1 + 0.01
    z = torch.randint(0, 256, (37,))
    expected = OPS.quantize_per_channel(x, s64.float(), z.int(), 1, torch.uint8)
    for zt in (torch.int64, torch.int32, torch.int16, torch.uint8):
        assert torch.equal(OPS.quantize_per_channel(x, s64, z.to(zt), 1, torch.uint8), expected)


# ----------------------------------------------------------------------------- wrappers, tracing

def test_wrappers():
    x = random_input((4, 6, 5), 0, 2.0, torch.float32)
    assert torch.equal(quantize(x, 0.05, 128), OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8))
    assert torch.equal(quantize(x, torch.tensor(0.05), 3, torch.int8),
                       OPS.quantize_per_tensor(x, 0.05, 3, torch.int8))
    s, z = torch.rand(6) * 0.1 + 0.01, torch.randint(-128, 128, (6,))
    q = quantize(x, s, z, torch.int8, axis=1)
    assert torch.equal(q, OPS.quantize_per_channel(x, s, z, 1, torch.int8))
    assert torch.equal(dequantize(q, s, z, axis=-2), OPS.dequantize_per_channel(q, s, z, 1, torch.float32))
    assert torch.equal(quantize(x, s, 0, torch.int8, axis=1),
                       OPS.quantize_per_channel(x, s, torch.zeros(6, dtype=torch.int32), 1, torch.int8))
    assert dequantize(q, 0.1, 0, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="axis"):
        quantize(x, s, z)


def test_opcheck_and_compile():
    x = random_input((4, 6), 0, 2.0, torch.float32)
    s, z = torch.rand(6) * 0.1 + 0.01, torch.randint(0, 256, (6,))
    q = OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8)
    for op, args in [(OPS.quantize_per_tensor.default, (x, 0.05, 128, torch.uint8)),
                     (OPS.quantize_per_channel.default, (x, s, z, -1, torch.uint8)),
                     (OPS.dequantize_per_tensor.default, (q, 0.05, 128)),
                     (OPS.dequantize_per_channel.default, (q, s, z, 1, torch.bfloat16))]:
        torch.library.opcheck(op, args)

    def f(x):
        return dequantize(OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8), 0.05, 128) * 2

    assert torch.equal(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))


# ----------------------------------------------------------------------------- torch as a peer

def test_peer_torch_quantization():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = random_input((256, 1024), 5, 2.0, torch.float32)
        for scale, zp in ((0.01, 128), (0.037, 0), (1 / 3, 255)):
            ours = OPS.quantize_per_tensor(x, scale, zp, torch.uint8)
            peer = torch.quantize_per_tensor(x, scale, zp, torch.quint8)
            diff = (ours.int() - peer.int_repr().int()).abs()
            assert diff.max() <= 1 and (diff > 0).double().mean() < 1e-3
            assert torch.equal(OPS.dequantize_per_tensor(peer.int_repr(), scale, zp), peer.dequantize())
        s = torch.rand(1024, dtype=torch.float64) * 0.05 + 0.005
        z = torch.randint(-128, 128, (1024,))
        ours = OPS.quantize_per_channel(x, s, z, 1, torch.int8)
        peer = torch.quantize_per_channel(x, s, z, 1, torch.qint8)
        diff = (ours.int() - peer.int_repr().int()).abs()
        assert diff.max() <= 1 and (diff > 0).double().mean() < 1e-3


# ----------------------------------------------------------------------------- ISA paths

ISA_CHILD = """
import sys, torch, qbackend
from qbackend.ops import quantize as _  # fake impls
if {scalar}:
    qbackend._C.set_isa_cap(0)
torch.set_num_threads(2)
ops = torch.ops.qbackend
inp = torch.load({inp!r})
x, s, z = inp["x"], inp["s"], inp["z"]
out = {{"level": int(qbackend._C.usable_isa())}}
for dt in (torch.uint8, torch.int8):
    zp = 77 if dt == torch.uint8 else -5
    for name, xx in (("f32", x), ("bf16", x.bfloat16())):
        q = ops.quantize_per_tensor(xx, 0.0371, zp, dt)
        out[f"q_{{name}}_{{dt}}"] = q
        out[f"dq_{{name}}_{{dt}}"] = ops.dequantize_per_tensor(q, 0.0371, zp, torch.bfloat16)
for i, img in enumerate(inp["images"]):
    for dt in (torch.uint8, torch.int8):
        out[f"cl_{{i}}_{{dt}}"] = ops.quantize_per_tensor(img, 0.0371, 3, dt, torch.channels_last)
for key, (xx, axis) in inp["pc"].items():
    zz = z[: xx.shape[axis]]
    q = ops.quantize_per_channel(xx, s[: xx.shape[axis]], zz, axis, torch.uint8)
    out["pc_" + key] = q
    out["dpc_" + key] = ops.dequantize_per_channel(q, s[: xx.shape[axis]], zz, axis, torch.float32)
torch.save(out, {outp!r})
"""


def test_isa_paths_agree():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(100003, generator=g) * 5
    x[:400] = (torch.arange(400) - 200 + 0.5) * R.f32(0.0371)  # ties
    x[400:403] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    s = torch.rand(7000, generator=g) * 0.05 + 0.005
    z = torch.randint(0, 256, (7000,), generator=g)
    pc = {"run": (torch.randn(3, 5, 7000, generator=g), 1), "expanded": (torch.randn(50000, 3, generator=g), -1),
          "small": (torch.randn(7, 13, 5, generator=g), 1)}
    # channels-first images into channels-last int8: the interleave's shuffles (3 and 4 channels,
    # 16 pixels at a time) and its tail loop
    images = [torch.randn(2, c, 5, w, generator=g) * 5 for c in (1, 2, 3, 4, 5) for w in (16, 37)]
    f = {k: v for k, v in qbackend._C.cpu_probe().items() if isinstance(v, tuple)}
    ok = {k: all(v) for k, v in f.items()}
    real = 0 if not (ok["avx2"] and ok["fma"]) else (
        2 if all(ok[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq")) else 1)
    # default: inherits our environment (and any QBACKEND_ISA in it); scalar: cap 0 via set_isa_cap
    paths = {"default": ({}, False, min(int(qbackend._C.usable_isa()), 2)),
             "avx512": ({"QBACKEND_ISA": "avx512"}, False, min(real, 2)),
             "avx2": ({"QBACKEND_ISA": "avx2"}, False, min(real, 1)), "scalar": ({}, True, 0)}
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.pt")
        torch.save({"x": x, "s": s, "z": z, "pc": pc, "images": images}, inp)

        def run(name):
            env, scalar, _ = paths[name]
            outp = os.path.join(tmp, f"{name}.pt")
            run_py(ISA_CHILD.format(scalar=scalar, inp=inp, outp=outp), env=env, check=True)
            return torch.load(outp)

        with ThreadPoolExecutor(len(paths)) as pool:
            results = dict(zip(paths, pool.map(run, paths)))
    for name, out in results.items():
        assert min(out["level"], 2) == paths[name][2], name  # levels >= 2 all run the AVX512 kernels
    base = results["scalar"]
    for dt in QDTYPES:
        zp = 77 if dt == torch.uint8 else -5
        # exact vs the fp32 model; planted ties make 1-LSB differences from fp64 common here
        check_quantized(base[f"q_f32_{dt}"], x, 0.0371, zp, dt)
        check_quantized(base[f"q_bf16_{dt}"], x.bfloat16(), 0.0371, zp, dt)
        check_dequantized(base[f"dq_f32_{dt}"], base[f"q_f32_{dt}"], 0.0371, zp, torch.bfloat16)
    for i, img in enumerate(images):
        for dt in QDTYPES:
            q = base[f"cl_{i}_{dt}"]
            assert q.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(q, OPS.quantize_per_tensor(img, 0.0371, 3, dt).contiguous(
                memory_format=torch.channels_last)), (i, dt)
    for key, (xx, axis) in pc.items():
        c = xx.shape[axis]
        check_quantized(base["pc_" + key], xx, s[:c], z[:c], torch.uint8, axis, max_mismatch=1e-3)
        check_dequantized(base["dpc_" + key], base["pc_" + key], s[:c], z[:c], torch.float32, axis)
    for name, out in results.items():
        for k, v in base.items():
            if k != "level":
                assert torch.equal(out[k], v), (name, k)


# ----------------------------------------------------------------------------- bad input

X = "torch.randn(2, 3)"
Q8 = "torch.zeros(2, 3, dtype=torch.uint8)"
S3, Z3 = "torch.full((3,), 0.1)", "torch.zeros(3, dtype=torch.int32)"
# op -> [(case, expression, exception type, text the message must contain)]
ERROR_CASES = {
    "quantize_per_tensor": [
        ("x_int", "op(torch.ones(3, dtype=torch.int32), 0.1, 0, torch.uint8)", "TypeError", "x must"),
        ("x_f64", "op(torch.ones(3, dtype=torch.float64), 0.1, 0, torch.uint8)", "TypeError", "x must"),
        ("scale_zero", f"op({X}, 0.0, 0, torch.uint8)", "ValueError", "scale must"),
        ("channels_last_3d_x", "op(torch.randn(2, 3, 4), 0.1, 0, torch.uint8, torch.channels_last)", "ValueError",
         "memory_format=torch.channels_last takes a 4-D x"),
        ("memory_format_3d", "op(torch.randn(1, 2, 3, 4, 5), 0.1, 0, torch.uint8, torch.channels_last_3d)",
         "ValueError", "memory_format must be"),
        ("scale_negative", f"op({X}, -1.0, 0, torch.uint8)", "ValueError", "scale must"),
        ("scale_nan", f"op({X}, float('nan'), 0, torch.uint8)", "ValueError", "scale must"),
        ("scale_inf", f"op({X}, float('inf'), 0, torch.uint8)", "ValueError", "scale must"),
        ("scale_f32_underflow", f"op({X}, 1e-50, 0, torch.uint8)", "ValueError", "scale must"),
        ("scale_f32_overflow", f"op({X}, 1e39, 0, torch.uint8)", "ValueError", "scale must"),
        ("zp_high_u8", f"op({X}, 0.1, 256, torch.uint8)", "ValueError", "zero_point must"),
        ("zp_low_u8", f"op({X}, 0.1, -1, torch.uint8)", "ValueError", "zero_point must"),
        ("zp_high_s8", f"op({X}, 0.1, 128, torch.int8)", "ValueError", "zero_point must"),
        ("dtype", f"op({X}, 0.1, 0, torch.float32)", "ValueError", "dtype must"),
        ("wrapper_axis", f"qbackend.ops.quantize({X}, {S3}, {Z3})", "ValueError", "axis"),
    ],
    "dequantize_per_tensor": [
        ("q_float", f"op({X}, 0.1, 0)", "TypeError", "q must"),
        ("scale_zero", f"op({Q8}, 0.0, 0)", "ValueError", "scale must"),
        ("scale_nan", f"op({Q8}, float('nan'), 0)", "ValueError", "scale must"),
        ("zp_range", f"op({Q8}, 0.1, 300)", "ValueError", "zero_point must"),
        ("zp_range_s8", f"op({Q8}.to(torch.int8), 0.1, 200)", "ValueError", "zero_point must"),
        ("out_dtype", f"op({Q8}, 0.1, 0, torch.int32)", "ValueError", "out_dtype must"),
    ],
    "quantize_per_channel": [
        ("x_int", f"op(torch.ones(2, 3, dtype=torch.int64), {S3}, {Z3}, 1, torch.uint8)", "TypeError", "x must"),
        ("dtype", f"op({X}, {S3}, {Z3}, 1, torch.bfloat16)", "ValueError", "dtype must"),
        ("axis_high", f"op({X}, {S3}, {Z3}, 2, torch.uint8)", "ValueError", "axis"),
        ("axis_low", f"op({X}, {S3}, {Z3}, -3, torch.uint8)", "ValueError", "axis"),
        ("axis_0d", f"op(torch.tensor(1.0), {S3}, {Z3}, 0, torch.uint8)", "ValueError", "axis"),
        ("scales_len", f"op({X}, torch.full((2,), 0.1), {Z3}, 1, torch.uint8)", "ValueError", "scales must"),
        ("scales_2d", f"op({X}, torch.full((1, 3), 0.1), {Z3}, 1, torch.uint8)", "ValueError", "scales must"),
        ("scales_int", f"op({X}, torch.ones(3, dtype=torch.int32), {Z3}, 1, torch.uint8)", "TypeError", "scales must"),
        ("scales_value", f"op({X}, torch.tensor([0.1, 0.0, 0.1]), {Z3}, 1, torch.uint8)", "ValueError", "scales must"),
        ("scales_nan", f"op({X}, torch.tensor([0.1, float('nan'), 0.1]), {Z3}, 1, torch.uint8)", "ValueError",
         "scales must"),
        ("scales_device", f"op({X}, {S3}.to('meta'), {Z3}, 1, torch.uint8)", "ValueError", "scales must"),
        ("zps_float", f"op({X}, {S3}, torch.zeros(3), 1, torch.uint8)", "TypeError", "zero_points must"),
        ("zps_len", f"op({X}, {S3}, torch.zeros(4, dtype=torch.int32), 1, torch.uint8)", "ValueError",
         "zero_points must"),
        ("zps_range", f"op({X}, {S3}, torch.tensor([0, 0, 128]), 1, torch.int8)", "ValueError", "zero_points must"),
    ],
    "dequantize_per_channel": [
        ("q_float", f"op({X}, {S3}, {Z3}, 1, torch.float32)", "TypeError", "q must"),
        ("out_dtype", f"op({Q8}, {S3}, {Z3}, 1, torch.uint8)", "ValueError", "out_dtype must"),
        ("axis", f"op({Q8}, {S3}, {Z3}, 5, torch.float32)", "ValueError", "axis"),
        ("scales_len", f"op({Q8}, torch.full((2,), 0.1), {Z3}, 1, torch.float32)", "ValueError", "scales must"),
        ("scales_inf", f"op({Q8}, torch.tensor([0.1, float('inf'), 0.1]), {Z3}, 1, torch.float32)", "ValueError",
         "scales must"),
        ("zps_float", f"op({Q8}, {S3}, torch.zeros(3), 1, torch.float32)", "TypeError", "zero_points must"),
        ("zps_range", f"op({Q8}, {S3}, torch.tensor([0, 256, 0]), 1, torch.float32)", "ValueError", "zero_points must"),
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
