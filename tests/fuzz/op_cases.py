"""The op-level differential fuzzer: random calls of every qbackend op family on every provider,
each checked against an fp64 reference on the same integers.

A case is a plain dict drawn by `draw_case(draw, family, provider)` (draw: tests/fuzz/draw.py);
`run_case(case)` builds its tensors from the case's seed, calls the op and returns
(outcome, detail), the outcome one of

  passed    the result matches the reference (the acceptance rule of tests/ops/numerics.py:
            integer outputs within 1 LSB at rounding ties only, float outputs within the fp32
            rounding bound of the terms; quantize bit-exact to the fp32 model; pooling exact)
  error     it raised a clear exception: ValueError / TypeError / RuntimeError whose message
            names an argument of the op (where the reference also has no answer, an error is
            required)
  refused   the routing layer refuses the op instance on this provider (Provider.refuses): the
            router never sends it there, so its value is not checked
  wrong     a value off the rule, a wrong dtype / shape / layout, an input modified, a result
            where an error was required, or an error that names no argument

Families (FAMILIES): linear, linear_dynamic, conv2d (dense, depthwise, grouped, 1x1; the fused
residual and the in-place conv2d_add_), quantize, dequantize, embedding, layer_norm, attention,
max_pool2d. Kernel families run on every kernel provider (native, fbgemm, onednn, reference);
embedding on builtin and fbgemm; the others have one implementation ("builtin").
"""
from __future__ import annotations

import math
import re
import traceback

import numpy as np
import torch
import torch.nn.functional as F

from qbackend.core.extension import _C
from qbackend.ops import PROVIDERS, PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import reference as R
from qbackend.ops.embedding import PackedEmbeddingTable, quantize_rowwise

from tests.ops.numerics import (assert_rule, dynamic_reference_input, embedding_bags_fp64, error_metrics,
                                output_scale_for, weights)

ops = torch.ops.qbackend

KERNEL_PROVIDERS = ("native", "fbgemm", "onednn", "reference")
FAMILIES = {
    "linear": KERNEL_PROVIDERS, "linear_dynamic": KERNEL_PROVIDERS, "conv2d": KERNEL_PROVIDERS,
    "quantize": ("builtin",), "dequantize": ("builtin",), "embedding": ("builtin", "fbgemm"),
    "layer_norm": ("builtin",), "attention": ("builtin",), "max_pool2d": ("builtin",),
}
OUTCOMES = ("passed", "error", "refused", "wrong")

# Names an error message must mention (as a word) to count as clear: every family's, and its own.
ARGUMENTS = ("x", "weight", "w_scales", "w_packed", "bias", "output_scale", "output_zero_point", "output_dtype",
             "out_dtype", "out_scale", "out_zero_point", "x_scale", "x_zero_point", "x_shape", "post_op", "scale",
             "scales", "zero_point", "zero_points", "dtype")
FAMILY_ARGUMENTS = {
    "linear": ("in_features", "reduce_range"), "linear_dynamic": ("in_features", "reduce_range"),
    "conv2d": ("stride", "padding", "dilation", "groups", "kernel", "in_channels", "out_channels", "channels", "accum",
               "accum_scale", "accum_zero_point"),
    "quantize": ("axis",), "dequantize": ("axis", "q"),
    "embedding": ("table", "indices", "offsets", "dim", "bits", "mode", "per_sample_weights", "padding_idx",
                  "qparams_dtype", "include_last_offset"),
    "layer_norm": ("residual", "eps", "qmax"), "attention": ("q", "k", "v", "mask"),
    "max_pool2d": ("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
}
_ARG_RE = {f: re.compile(r"\b(" + "|".join(sorted(ARGUMENTS + extra, key=len, reverse=True)) + r")\b")
           for f, extra in FAMILY_ARGUMENTS.items()}
CLEAR_TYPES = (ValueError, TypeError, RuntimeError)


class Wrong(Exception):
    """The op's answer breaks its contract (the message says how)."""


def _exact(provider: str) -> bool:
    return PROVIDERS[provider].exact_8bit()


def _gen(case) -> torch.Generator:
    return torch.Generator().manual_seed(case["seed"])


def _zp(d, dtype_name: str) -> int:
    lo, hi = (0, 255) if dtype_name == "uint8" else (-128, 127)
    ends = [lo, hi] if dtype_name == "uint8" else [lo, hi, 0]
    return d.choice(ends) if d.chance(0.6) else d.integer(lo, hi)


def _scale(d, lo=1e-12, hi=1e6, usual=(1e-3, 1.0)) -> float:
    """A scale over the whole accepted range, mostly in the usual one."""
    return R.f32(d.log_uniform(lo, hi) if d.chance(0.3) else d.log_uniform(*usual))


DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _out_dtype(d) -> str:
    return d.choice(["uint8", "int8", "float32", "uint8", "int8", "float32", "bfloat16"])


def _activations(shape, dtype, zp, mode, g):
    lo, hi = R.QRANGE[dtype]
    if mode == "seven_bit":
        lo, hi = (0, 127) if dtype == torch.uint8 else (-64, 63)
    if mode == "ends":
        v = torch.where(torch.rand(shape, generator=g) < 0.5, lo, hi)
    elif mode == "near_zp":
        v = (torch.randint(-4, 5, shape, generator=g) + zp).clamp(lo, hi)
    else:
        v = torch.randint(lo, hi + 1, shape, generator=g)
    return v.to(dtype)


def _log_uniform(g, n, lo, hi):
    return (10 ** (torch.rand(n, generator=g, dtype=torch.float64) * (math.log10(hi) - math.log10(lo))
                   + math.log10(lo))).float()


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x with the same values in another memory layout (a view where it can be one)."""
    if layout == "channels_last" and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # every other element of a tensor twice as wide: not contiguous
        big = torch.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype) if x.dim() else x
        if x.dim() == 0:
            return x
        big[..., ::2] = x
        return big[..., ::2]
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x.contiguous()


def _check_rule(y, y64, bound, out_dtype, out_scale, out_zp, what):
    """tests/ops/numerics.py's acceptance rule; for integer outputs whose LSB is finer than the fp32
    rounding of the terms (tiny output scales), an element may also be off by the LSBs that
    rounding spans: 1 + floor(2 (1e-5 bound + 1e-6) / output_scale)."""
    m = error_metrics(y, y64, bound, out_dtype, out_scale, out_zp)
    try:
        assert_rule(m, what)
    except AssertionError as e:
        if out_dtype in R.QRANGE and m["untied"] == 0:
            ref = R.quantize(y64.double(), out_scale, out_zp, out_dtype).long()
            slack = (1e-5 * bound.double() + 1e-6) / R.f32(out_scale)
            if bool(((y.long() - ref).abs() <= 1 + torch.floor(2 * slack)).all()):
                return
        raise Wrong(str(e)) from None


def _check_meta(y, dtype, shape, what):
    if y.dtype != dtype or tuple(y.shape) != tuple(shape):
        raise Wrong(f"{what}: got {y.dtype} {tuple(y.shape)}, expected {dtype} {tuple(shape)}")


# ----------------------------------------------------------------------------- linear

def _draw_linear(d, provider, dynamic):
    c = {"family": "linear_dynamic" if dynamic else "linear", "provider": provider,
         "seed": d.integer(0, 2**31 - 1)}
    big = d.chance(0.04)
    if big:  # long reductions: up to 2^18 products (past 65536: refused)
        c["k"] = d.choice([4096, 65535, 65536, 65537, 70000, 131072, 2**18])
        c["m"], c["n"] = d.integer(0, 2), d.integer(1, 4)
    else:
        c["k"] = d.choice([1, 3, 16, 64, 67, 129, 256]) if d.chance(0.3) else d.integer(1, 200)
        c["m"] = d.choice([0, 1, 1, 2, 4, 5, 16, 33, 64]) if d.chance(0.5) else d.integer(0, 80)
        c["n"] = d.choice([1, 3, 16, 17, 33, 64]) if d.chance(0.4) else d.integer(1, 64)
    c["lead"] = d.choice([[], [], [], [2], [3], [0], [2, 1]])
    c["layout"] = d.choice(["contiguous", "contiguous", "strided", "transposed"])
    c["w_mode"] = d.choice(["full", "ends", "sparse"])
    c["w_scale_lo"] = R.f32(d.log_uniform(1e-8, 1e-1))
    c["bias"] = d.choice([None, 1e-3, 1.0, 100.0])
    c["post_op"] = d.choice(["none", "relu", "gelu"])
    if dynamic:
        c["x_kind"] = d.choice(["mixed", "positive", "negative", "zeros", "spiky", "constant"])
        c["x_mag"] = d.log_uniform(1e-6, 1e6)
        c["reduce_range"] = d.chance(0.5)
        return c
    exact = provider == "reference" or _exact(provider)
    c["x_dtype"] = d.choice(["uint8", "int8"]) if exact else "uint8"
    c["x_mode"] = "seven_bit" if not exact else d.choice(["full", "ends", "near_zp", "full"])
    c["x_zp"] = _zp(d, c["x_dtype"])
    c["x_scale"] = _scale(d)
    c["out_dtype"] = _out_dtype(d)
    c["out_zp"] = _zp(d, c["out_dtype"] if c["out_dtype"] in ("uint8", "int8") else "uint8")
    c["out_scale"] = None if d.chance(0.75) else _scale(d)  # None: about span LSBs of |y|max
    c["span"] = d.choice([20.0, 100.0, 400.0])
    c["x_shape_hint"] = d.choice(["none", "actual", "other"])
    return c


def _linear_bound(x, x_scale, x_zp, w, w_scales, bias):
    b = ((x.double() - int(x_zp)).abs() @ w.double().abs().t()) * R.f32(x_scale) * w_scales.float().double()
    return b if bias is None else b + bias.float().double().abs()


def _linear_shape_key(c):
    m = c["m"]
    for v in c["lead"]:
        m *= v
    return {"m": m, "k": c["k"], "n": c["n"], "gelu": int(c["post_op"] == "gelu")}


def _run_linear(c):
    g = _gen(c)
    k, n = c["k"], c["n"]
    x_shape = (*c["lead"], c["m"], k)
    w = weights((n, k), c["w_mode"], g)
    ws = _log_uniform(g, n, c["w_scale_lo"], min(1.0, c["w_scale_lo"] * 1000))
    bias = None if c["bias"] is None else torch.randn(n, generator=g) * c["bias"]
    if c["family"] == "linear_dynamic":
        return _run_linear_dynamic(c, g, x_shape, w, ws, bias)
    x_dtype = DTYPES[c["x_dtype"]]
    x = _layout(_activations(x_shape, x_dtype, c["x_zp"], c["x_mode"], g), c["layout"])
    hint = {"none": None, "actual": list(x.shape), "other": [5, k]}[c["x_shape_hint"]]
    x_before = x.clone()
    pw = PackedLinearWeight(w, ws, bias, c["provider"], x_shape=hint)
    out_dtype = DTYPES[c["out_dtype"]]
    y64 = R.linear_fp64(x, c["x_scale"], c["x_zp"], w, ws, bias, c["post_op"])
    out_scale = c["out_scale"] if c["out_scale"] is not None else output_scale_for(y64, c["span"])
    y = pw.linear(x, c["x_scale"], c["x_zp"], out_scale, c["out_zp"], out_dtype, c["post_op"])
    what = f"linear out_scale={out_scale:.4g}"
    _check_meta(y, out_dtype, (*x_shape[:-1], n), what)
    if not torch.equal(x, x_before):
        raise Wrong(f"{what}: x was modified")
    _check_rule(y, y64, _linear_bound(x, c["x_scale"], c["x_zp"], w, ws, bias), out_dtype, out_scale, c["out_zp"],
                what)


def _dynamic_x(c, shape, g):
    x = torch.randn(shape, generator=g) * c["x_mag"]
    kind = c["x_kind"]
    if kind == "positive":
        x = x.abs() + c["x_mag"]
    elif kind == "negative":
        x = -x.abs() - c["x_mag"]
    elif kind == "zeros":
        x = torch.zeros(shape)
    elif kind == "constant":
        x = torch.full(shape, c["x_mag"])
    elif kind == "spiky" and x.numel():
        x.view(-1)[0] = 1000 * c["x_mag"]
    return x


def _dynamic_reference_input(x, reduce_range):
    try:
        return dynamic_reference_input(x, reduce_range)
    except AssertionError:
        raise Wrong("the fp32 quantize of x differs from the reference away from a tie") from None


def _run_linear_dynamic(c, g, x_shape, w, ws, bias):
    x = _layout(_dynamic_x(c, x_shape, g), c["layout"])
    pw = PackedLinearWeight(w, ws, bias, c["provider"])
    if not c["reduce_range"] and not _exact(c["provider"]):
        c["_requires_error"] = "reduce_range=False where the provider saturates 8-bit products"
    y = pw.linear_dynamic(x, reduce_range=c["reduce_range"], post_op=c["post_op"])
    _check_meta(y, torch.float32, (*x_shape[:-1], c["n"]), "linear_dynamic")
    if y.numel() == 0:
        return
    x2 = x.reshape(-1, c["k"])
    if c["provider"] == "reference":  # the fp64 quantize itself
        s, z = R.choose_dynamic_qparams(x2, c["reduce_range"])
        q = R.quantize(x2, s, z, torch.uint8)
    else:
        q, s, z = _dynamic_reference_input(x2, c["reduce_range"])
    y64 = R.linear(q, s, z, w, ws, bias, post_op=c["post_op"]).reshape(y.shape)
    bound = _linear_bound(q, s, z, w, ws, bias).reshape(y.shape)
    _check_rule(y, y64, bound, torch.float32, 1.0, 0, "linear_dynamic")


# ----------------------------------------------------------------------------- conv2d

def _draw_conv(d, provider):
    c = {"family": "conv2d", "provider": provider, "seed": d.integer(0, 2**31 - 1)}
    kind = d.choice(["dense", "dense", "depthwise", "grouped", "pointwise"])
    c["kind"] = kind
    if kind == "depthwise":
        c["groups"] = d.integer(1, 24)
        c["c_in"], c["c_out"] = c["groups"], c["groups"] * d.choice([1, 1, 2, 3])
    elif kind == "grouped":
        c["groups"] = d.integer(2, 4)
        c["c_in"], c["c_out"] = c["groups"] * d.integer(1, 8), c["groups"] * d.integer(1, 8)
    else:
        c["groups"] = 1
        c["c_in"], c["c_out"] = d.integer(1, 40), d.integer(1, 40)
    if kind == "pointwise":
        c["kernel"] = [1, 1]
    else:
        c["kernel"] = [d.integer(1, 7), d.integer(1, 7)] if d.chance(0.4) else [d.choice([1, 3, 5, 7])] * 2
    if d.chance(0.02):  # a reduction past 65536 products: refused
        c["c_in"], c["groups"], c["c_out"], c["kernel"] = d.choice([7282, 8192]), 1, 2, [3, 3]
    c["n"] = d.choice([0, 1, 1, 1, 2, 3])
    c["h"], c["w"] = d.integer(1, 12), d.integer(1, 12)
    c["stride"] = [d.choice([1, 1, 2, 3]), d.choice([1, 1, 2, 3])]
    c["padding"] = [d.choice([0, 0, 1, 2, 3, 4]), d.choice([0, 0, 1, 2, 3, 4])]
    c["dilation"] = [d.choice([1, 1, 1, 2, 3]), d.choice([1, 1, 1, 2, 3])]
    c["layout"] = d.choice(["channels_last", "channels_last", "contiguous", "strided"])
    exact = provider == "reference" or _exact(provider)
    c["x_dtype"] = d.choice(["uint8", "int8"]) if exact else "uint8"
    c["x_mode"] = "seven_bit" if not exact else d.choice(["full", "ends", "near_zp", "full"])
    c["x_zp"] = _zp(d, c["x_dtype"])
    c["x_scale"] = _scale(d)
    c["w_mode"] = d.choice(["full", "ends", "sparse"])
    c["w_scale_lo"] = R.f32(d.log_uniform(1e-8, 1e-1))
    c["bias"] = d.choice([None, 1e-3, 1.0, 100.0])
    c["post_op"] = d.choice(["none", "relu", "gelu"])
    c["out_dtype"] = _out_dtype(d)
    c["out_zp"] = _zp(d, c["out_dtype"] if c["out_dtype"] in ("uint8", "int8") else "uint8")
    c["out_scale"] = None if d.chance(0.75) else _scale(d)
    c["span"] = d.choice([20.0, 100.0, 400.0])
    c["accum"] = d.choice([None, None, None, "uint8", "int8", "add_", "alias_x"])
    c["accum_zp"] = _zp(d, "int8" if c["accum"] == "int8" else "uint8")
    c["accum_scale"] = _scale(d)
    c["x_qparams_hint"] = d.chance(0.5)
    return c


def conv_shape_key(c) -> dict:
    """The routing shape of a conv case (the keys LayerSpec.shape_key gives, plus dilation)."""
    return {"n": c["n"], "c_in": c["c_in"], "c_out": c["c_out"], "h": c["h"], "w": c["w"],
            "kernel": tuple(c["kernel"]), "stride": tuple(c["stride"]), "padding": tuple(c["padding"]),
            "dilation": tuple(c["dilation"]), "groups": c["groups"], "int8_residual": int(c["accum"] is not None),
            "x_zp": c["x_zp"]}


def _conv_bound(x, x_scale, x_zp, w, ws, bias, c, accum=None, accum_scale=1.0, accum_zp=0):
    t = F.conv2d((x.double() - int(x_zp)).abs(), w.double().abs(), None, c["stride"], c["padding"], c["dilation"],
                 c["groups"])
    b = t * R.f32(x_scale) * ws.double().reshape(1, -1, 1, 1)
    if bias is not None:
        b = b + bias.double().abs().reshape(1, -1, 1, 1)
    if accum is not None:
        b = b + R.dequantize(accum, accum_scale, accum_zp).abs()
    return b


def _run_conv(c):
    g = _gen(c)
    x_dtype = DTYPES[c["x_dtype"]]
    kh, kw = c["kernel"]
    w = weights((c["c_out"], c["c_in"] // c["groups"], kh, kw), c["w_mode"], g)
    ws = _log_uniform(g, c["c_out"], c["w_scale_lo"], min(1.0, c["w_scale_lo"] * 1000))
    bias = None if c["bias"] is None else torch.randn(c["c_out"], generator=g) * c["bias"]
    x = _layout(_activations((c["n"], c["c_in"], c["h"], c["w"]), x_dtype, c["x_zp"], c["x_mode"], g), c["layout"])
    x_before = x.clone()
    try:
        y64_plain = R.conv2d_fp64(x, c["x_scale"], c["x_zp"], w, ws, bias, c["stride"], c["padding"], c["dilation"],
                                  c["groups"], post_op=c["post_op"])
    except RuntimeError as e:  # aten has no output for this geometry (kernel larger than the padded input)
        c["_requires_error"] = f"aten conv2d raises: {str(e).splitlines()[0]}"
        y64_plain = None
    hint = list(x.shape) if c["x_qparams_hint"] else None
    qp = (c["x_scale"], c["x_zp"]) if c["x_qparams_hint"] else None
    pw = PackedConv2dWeight(w, ws, bias, c["stride"], c["padding"], c["dilation"], c["groups"], c["provider"],
                            x_shape=hint, x_qparams=qp)
    out_dtype = DTYPES[c["out_dtype"]]
    if y64_plain is None:  # must raise
        pw.conv2d(x, c["x_scale"], c["x_zp"], 1.0, 0, out_dtype, c["post_op"])
        return
    oshape = y64_plain.shape
    accum = None
    mode = c["accum"]
    if mode == "alias_x":
        if tuple(oshape) != tuple(x.shape) or out_dtype != x.dtype:
            mode = None
        elif PROVIDERS[c["provider"]].conv2d_add_ is None:  # conv2d_add_ runs conv2d: nothing is overwritten
            pass
        else:
            c["_requires_error"] = "accum is x (the in-place residual conv may not overwrite its input)"
    if mode in ("uint8", "int8", "add_"):
        a_dtype = out_dtype if mode == "add_" and out_dtype in (torch.uint8, torch.int8) else \
            (torch.int8 if mode == "int8" else torch.uint8)
        lo, hi = R.QRANGE[a_dtype]
        accum = torch.randint(lo, hi + 1, tuple(oshape), generator=g).to(a_dtype)
        accum = accum.contiguous(memory_format=torch.channels_last) if c["seed"] & 1 else accum
        if a_dtype == torch.int8 and not (-128 <= c["accum_zp"] <= 127):
            c["accum_zp"] = 0
        if a_dtype == torch.uint8 and not (0 <= c["accum_zp"] <= 255):
            c["accum_zp"] = 128
    y64 = y64_plain if accum is None else R.conv2d_fp64(
        x, c["x_scale"], c["x_zp"], w, ws, bias, c["stride"], c["padding"], c["dilation"], c["groups"], accum,
        c["accum_scale"], c["accum_zp"], c["post_op"])
    out_scale = c["out_scale"] if c["out_scale"] is not None else output_scale_for(y64, c["span"])
    what = f"conv2d out_scale={out_scale:.4g} accum={mode}"
    if mode == "alias_x":
        pw.conv2d_add_(x, c["x_scale"], c["x_zp"], out_scale, c["out_zp"], out_dtype, c["post_op"], x,
                       c["accum_scale"], c["accum_zp"])
        return
    if mode == "add_":
        accum_before = accum.clone()
        y = pw.conv2d_add_(x, c["x_scale"], c["x_zp"], out_scale, c["out_zp"], out_dtype, c["post_op"], accum,
                           c["accum_scale"], c["accum_zp"])
        if y is not accum and not torch.equal(accum, accum_before):
            raise Wrong(f"{what}: conv2d_add_ returned a new tensor but modified accum")
        bound = _conv_bound(x, c["x_scale"], c["x_zp"], w, ws, bias, c, accum_before, c["accum_scale"], c["accum_zp"])
    else:
        accum_before = accum.clone() if accum is not None else None
        y = pw.conv2d(x, c["x_scale"], c["x_zp"], out_scale, c["out_zp"], out_dtype, c["post_op"], accum,
                      c["accum_scale"], c["accum_zp"])
        if accum is not None and not torch.equal(accum, accum_before):
            raise Wrong(f"{what}: accum was modified")
        bound = _conv_bound(x, c["x_scale"], c["x_zp"], w, ws, bias, c, accum, c["accum_scale"], c["accum_zp"])
    _check_meta(y, out_dtype, oshape, what)
    if mode != "add_" and y.numel() and not y.is_contiguous(memory_format=torch.channels_last):
        raise Wrong(f"{what}: the output is not channels-last")
    if not torch.equal(x, x_before):
        raise Wrong(f"{what}: x was modified")
    _check_rule(y, y64, bound, out_dtype, out_scale, c["out_zp"], what)


# ----------------------------------------------------------------------------- quantize / dequantize

def _draw_quantize(d, family):
    c = {"family": family, "provider": "builtin", "seed": d.integer(0, 2**31 - 1)}
    c["shape"] = d.choice([[], [0], [1], [7], [3, 5], [2, 0, 4], [2, 3, 4, 5], [1, 17, 3, 3], [4, 130], [33]])
    c["layout"] = d.choice(["contiguous", "contiguous", "channels_last", "strided", "transposed"])
    c["dtype"] = d.choice(["uint8", "int8"])
    c["per_channel"] = bool(c["shape"]) and d.chance(0.4)
    c["axis"] = d.integer(-len(c["shape"]), len(c["shape"]) - 1) if c["per_channel"] else None
    c["scale"] = _scale(d)
    c["zp"] = _zp(d, c["dtype"])
    c["x_mag"] = d.log_uniform(1e-12, 1e7)
    c["specials"] = d.chance(0.3)
    c["out_dtype"] = d.choice(["float32", "float32", "bfloat16"])
    c["bad"] = d.choice([None] * 12 + ["zero_scale", "negative_scale", "nan_scale", "inf_scale", "tiny_scale",
                                       "zp_low", "zp_high", "bad_dtype"])
    return c


def _scales_of(c, n, g):
    if not c["per_channel"]:
        return c["scale"]
    return (_log_uniform(g, n, max(1e-12, c["scale"] / 100), min(1e6, c["scale"] * 100)))


def _fp32_quantize_model(x, scale, zp, dtype, axis=None):
    """Exact fp32 model of the quantize kernels (IEEE fp32 division, rint, NaN -> zero point)."""
    qmin, qmax = R.QRANGE[dtype]
    xs = x.float().contiguous().numpy()
    if axis is None:
        s, z = np.float32(scale), np.int64(zp)
    else:
        shape = [1] * x.dim()
        shape[axis] = -1
        s = scale.float().numpy().reshape(shape)
        z = zp.long().numpy().reshape(shape)
    with np.errstate(all="ignore"):
        v = (xs / s).astype(np.float32)
    v = np.where(np.isnan(v), np.float32(0), v)
    r = np.rint(v).astype(np.float64) + z
    return torch.from_numpy(np.asarray(np.clip(r, qmin, qmax), dtype=np.int64))


def _run_quantize(c):
    g = _gen(c)
    dtype = DTYPES[c["dtype"]]
    shape = tuple(c["shape"])
    axis = None if c["axis"] is None else c["axis"] % len(shape)
    n = shape[axis] if axis is not None else 1
    scale = _scales_of(c, n, g)
    zp = c["zp"] if axis is None else torch.full((n,), c["zp"], dtype=torch.int32)
    bad = c["bad"]
    if bad is not None:
        bad_value = {"zero_scale": 0.0, "negative_scale": -c["scale"], "nan_scale": float("nan"),
                     "inf_scale": float("inf"), "tiny_scale": 1e-46}.get(bad)
        if bad_value is not None:
            scale = bad_value if axis is None else torch.full((n,), bad_value)
        elif bad in ("zp_low", "zp_high"):
            v = (-1 if dtype == torch.uint8 else -129) if bad == "zp_low" else (256 if dtype == torch.uint8 else 128)
            zp = v if axis is None else torch.full((n,), v, dtype=torch.int32)
        if not (bad in ("zp_low", "zp_high") and axis is not None and n == 0) and \
                not (bad_value is not None and axis is not None and n == 0):
            c["_requires_error"] = f"invalid argument ({bad})"
    if c["family"] == "quantize":
        x = torch.randn(shape, generator=g) * c["x_mag"]
        if c["specials"] and x.numel():
            flat = x.view(-1)
            idx = torch.randint(0, x.numel(), (min(4, x.numel()),), generator=g)
            flat[idx] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38])[:idx.numel()]
        x = _layout(x, c["layout"])
        if bad == "bad_dtype":
            x = x.double()
            c["_requires_error"] = "x is float64"
        x_before = x.clone()
        q = qbackend_quantize(x, scale, zp, dtype, axis)
        _check_meta(q, dtype, shape, "quantize")
        if not torch.equal(x.nan_to_num(1.5), x_before.nan_to_num(1.5)):
            raise Wrong("quantize modified x")
        want = _fp32_quantize_model(x, scale, zp, dtype, axis)
        if not torch.equal(q.long(), want):
            i = int((q.long() != want).view(-1).nonzero()[0])
            raise Wrong(f"quantize: element {i}: {int(q.reshape(-1)[i])} != fp32 model {int(want.reshape(-1)[i])} "
                        f"(x={float(x.reshape(-1)[i])!r})")
        return
    lo, hi = R.QRANGE[dtype]
    q = _layout(torch.randint(lo, hi + 1, shape, generator=g).to(dtype), c["layout"])
    if bad == "bad_dtype":
        q = q.to(torch.int32)
        c["_requires_error"] = "q is int32"
    out_dtype = DTYPES[c["out_dtype"]]
    y = qbackend_dequantize(q, scale, zp, axis, out_dtype)
    _check_meta(y, out_dtype, shape, "dequantize")
    if axis is None:
        want = (q.double() - int(zp)) * R.f32(float(scale))
    else:
        view = [1] * len(shape)
        view[axis] = -1
        want = (q.double() - zp.double().reshape(view)) * scale.float().double().reshape(view)
    want = want.float().to(out_dtype)  # one fp32 rounding of the exact product, then bf16's
    if not torch.equal(y, want):
        raise Wrong(f"dequantize: max |diff| {float((y.double() - want.double()).abs().max())}")


def qbackend_quantize(x, scale, zp, dtype, axis):
    from qbackend.ops import quantize
    return quantize(x, scale, zp, dtype, axis)


def qbackend_dequantize(q, scale, zp, axis, out_dtype):
    from qbackend.ops import dequantize
    return dequantize(q, scale, zp, axis, out_dtype)


# ----------------------------------------------------------------------------- embedding

def _draw_embedding(d, provider):
    c = {"family": "embedding", "provider": provider, "seed": d.integer(0, 2**31 - 1)}
    c["rows"] = d.choice([1, 1, 2, 3, 17, 50])
    c["bits"] = d.choice([8, 8, 4])
    c["dim"] = d.integer(1, 40) if c["bits"] == 8 else 2 * d.integer(1, 20)
    c["qparams"] = d.choice(["float16", "float16", "float32"])
    c["mag"] = d.log_uniform(1e-6, 1e4)
    c["n_bags"] = d.integer(0, 6)
    c["idx_dtype"] = d.choice(["int64", "int32"])
    c["mode"] = d.choice(["sum", "mean"])
    c["weighted"] = c["mode"] == "sum" and d.chance(0.4)
    c["include_last"] = d.chance(0.4)
    c["padding_idx"] = d.choice([-1, -1, 0]) if provider == "builtin" else -1
    c["lookup"] = d.chance(0.2)
    return c


def _run_embedding(c):
    g = _gen(c)
    weight = torch.randn(c["rows"], c["dim"], generator=g) * c["mag"]
    qp = DTYPES.get(c["qparams"], torch.float16) if c["qparams"] == "float32" else torch.float16
    table = quantize_rowwise(weight, c["bits"], qp)
    t = PackedEmbeddingTable(table, c["dim"], c["bits"], c["provider"])
    idt = torch.int64 if c["idx_dtype"] == "int64" else torch.int32
    if c["lookup"]:
        idx = torch.randint(0, c["rows"], (2, 3), generator=g).to(idt)
        out = t.lookup(idx)
        _check_meta(out, torch.float32, (2, 3, c["dim"]), "lookup")
        ref, mag = embedding_bags_fp64(table, c["dim"], c["bits"], idx.reshape(-1), torch.arange(6), "sum", None, False, -1)
        ref, mag = ref.reshape(2, 3, -1), mag.reshape(2, 3, 1)
    else:
        lengths = torch.randint(0, 7, (c["n_bags"],), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        total = int(offsets[-1])
        offsets = (offsets if c["include_last"] else offsets[:-1]).to(idt)
        indices = torch.randint(0, c["rows"], (total,), generator=g).to(idt)
        psw = torch.randn(total, generator=g) if c["weighted"] else None
        out = t.bag(indices, offsets, c["mode"], psw, c["include_last"], c["padding_idx"])
        ref, mag = embedding_bags_fp64(table, c["dim"], c["bits"], indices, offsets, c["mode"], psw, c["include_last"],
                              c["padding_idx"])
        _check_meta(out, torch.float32, ref.shape, "embedding_bag")
        mag = mag[:, None]
    bound = 2.0 ** -23 * 8 * mag + 1e-30
    if not bool(((out.double() - ref).abs() <= bound).all()):
        raise Wrong(f"embedding: max |diff| {float((out.double() - ref).abs().max())}")


# ----------------------------------------------------------------------------- layer_norm

def _draw_layer_norm(d):
    c = {"family": "layer_norm", "provider": "builtin", "seed": d.integer(0, 2**31 - 1)}
    c["shape"] = d.choice([[1, 1], [5, 7], [3, 16], [2, 3, 40], [130, 33], [4, 768], [0, 8], [1, 4096]])
    c["residual"] = d.choice([None, "full", "broadcast"])
    c["affine"] = d.chance(0.5)
    c["eps"] = d.choice([1e-12, 1e-5, 1e-3])
    c["dtype"] = d.choice(["uint8", "int8"])
    c["zp"] = _zp(d, c["dtype"])
    c["qmax"] = d.choice([127, 255]) if c["dtype"] == "uint8" else 127
    if c["zp"] > c["qmax"]:
        c["zp"] = c["qmax"]
    c["scale"] = _scale(d)
    c["x_mag"] = d.log_uniform(1e-3, 1e3)
    c["layout"] = d.choice(["contiguous", "strided"])
    return c


def _run_layer_norm(c):
    g = _gen(c)
    shape = tuple(c["shape"])
    ch = shape[-1]
    x = _layout(torch.randn(shape, generator=g) * c["x_mag"] + c["x_mag"], c["layout"])
    r = None
    if c["residual"] == "full":
        r = torch.randn(shape, generator=g)
    elif c["residual"] == "broadcast":
        r = torch.randn(shape[-1:], generator=g)
    wt = torch.rand(ch, generator=g) + 0.5 if c["affine"] else None
    b = torch.randn(ch, generator=g) if c["affine"] else None
    scales = _log_uniform(g, ch, max(1e-12, c["scale"] / 10), min(1e6, c["scale"] * 10))
    dtype = DTYPES[c["dtype"]]
    lo = 0 if dtype == torch.uint8 else -128
    y, q = ops.layer_norm_quantize(x, r, wt, b, c["eps"], scales, c["zp"], dtype, c["qmax"])
    _check_meta(y, torch.float32, shape, "layer_norm y")
    _check_meta(q, dtype, shape, "layer_norm q")
    s = x.double() + (r.double() if r is not None else 0)
    mean = s.mean(-1, keepdim=True)
    var = (s - mean).pow(2).mean(-1, keepdim=True)
    ref = (s - mean) / torch.sqrt(var + c["eps"])
    if wt is not None:
        ref = ref * wt.double() + b.double()
    if y.numel() == 0:
        return
    if ch > 1:
        # fp32 rounding of the sums, relative to the row's spread (x + r in fp32 first)
        spread = (s.abs().amax(-1, keepdim=True) / torch.sqrt(var + c["eps"])).clamp(min=1.0)
        tol = 2e-5 * spread * (wt.double().abs().max() if wt is not None else 1.0) + 2e-5
        if bool(((y.double() - ref).abs() > tol).any()):
            raise Wrong(f"layer_norm y: max |diff| {float((y.double() - ref).abs().max())}")
    qy = torch.clamp(torch.round(y / scales).double() + c["zp"], lo, c["qmax"])  # fp32 division, as the kernel
    if not torch.equal(q.double(), qy):
        raise Wrong("layer_norm q is not the quantize of its own y")


# ----------------------------------------------------------------------------- attention

def _draw_attention(d):
    c = {"family": "attention", "provider": "builtin", "seed": d.integer(0, 2**31 - 1)}
    c["B"], c["H"] = d.integer(1, 3), d.integer(1, 3)
    c["Sq"], c["Sk"] = d.choice([1, 2, 5, 17, 33, 64]), d.choice([1, 3, 8, 19, 40, 65])
    c["D"], c["Dv"] = d.choice([1, 7, 16, 32, 33, 64, 80]), d.choice([1, 5, 16, 40, 64])
    c["mask"] = d.choice([None, None, "bool", "bool_pad", "float", "float_2d"])
    c["causal"] = c["mask"] is None and d.chance(0.3)
    c["scale"] = d.choice([None, 0.05, 1.0])
    c["out_dtype"] = d.choice(["float32", "float32", "uint8", "int8"])
    c["out_zp"] = _zp(d, c["out_dtype"] if c["out_dtype"] != "float32" else "uint8")
    c["mag"] = d.log_uniform(1e-2, 10)
    c["layout"] = d.choice(["contiguous", "transposed_view"])
    return c


def _run_attention(c):
    from qbackend.ops import attention
    g = _gen(c)
    B, H, Sq, Sk, D, Dv = c["B"], c["H"], c["Sq"], c["Sk"], c["D"], c["Dv"]

    def t(s, dd):
        if c["layout"] == "transposed_view":  # a Linear's [B, S, H*D] output viewed as heads, not copied
            return (torch.randn(B, s, H, dd, generator=g) * c["mag"]).transpose(1, 2)
        return torch.randn(B, H, s, dd, generator=g) * c["mag"]
    q, k, v = t(Sq, D), t(Sk, D), t(Sk, Dv)
    mask = None
    if c["mask"] == "bool":
        mask = torch.rand(B, 1, Sq, Sk, generator=g) > 0.3
        mask[..., 0] = True
    elif c["mask"] == "bool_pad":
        mask = torch.rand(B, 1, 1, Sk, generator=g) > 0.2
    elif c["mask"] == "float":
        mask = torch.randn(B, H, 1, Sk, generator=g)
    elif c["mask"] == "float_2d":
        mask = torch.randn(Sq, Sk, generator=g)
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(D)
    qd, kd, vd = q.double(), k.double(), v.double()
    s = (qd @ kd.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if c["causal"]:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    ref = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ vd
    vmax = float(v.abs().max())
    # fp32 products: 1e-5 of max|v| per unit of max|score|; bf16 products where the CPU has them
    smax = float(torch.nan_to_num(s, neginf=0.0).abs().max()) if s.numel() else 1.0
    tol = (2.0 ** -7 if _C.bf16_usable() else 1e-5) * vmax * max(1.0, smax) + 1e-6
    out_dtype = DTYPES[c["out_dtype"]]
    if out_dtype == torch.float32:
        y = attention(q, k, v, mask, scale, c["causal"])
        _check_meta(y, torch.float32, (B, H, Sq, Dv), "attention")
        if float((y.double() - ref).abs().max()) > tol:
            raise Wrong(f"attention: max |diff| {float((y.double() - ref).abs().max())} > {tol}")
        return
    lo, hi = R.QRANGE[out_dtype]
    osc = R.f32(max(float(ref.abs().max()), 1e-6) / 100 * 1.0731)
    y = attention(q, k, v, mask, scale, c["causal"], out_dtype=out_dtype, out_scale=osc, out_zero_point=c["out_zp"])
    _check_meta(y, out_dtype, (B, H, Sq, Dv), "attention")
    want = (ref / osc).round().add(c["out_zp"]).clamp(lo, hi)
    slack = 1 + math.ceil(tol / osc)
    if float((y.double() - want).abs().max()) > slack:
        raise Wrong(f"attention: off by {float((y.double() - want).abs().max())} levels")


# ----------------------------------------------------------------------------- max_pool2d

def _draw_pool(d):
    c = {"family": "max_pool2d", "provider": "builtin", "seed": d.integer(0, 2**31 - 1)}
    c["n"], c["c"] = d.choice([0, 1, 1, 2]), d.choice([0, 1, 3, 16, 70]) if d.chance(0.5) else d.integer(1, 40)
    c["h"], c["w"] = d.integer(1, 13), d.integer(1, 13)
    c["kernel"] = [d.integer(1, 7), d.integer(1, 7)]
    c["stride"] = d.choice([[], [1, 1], [2, 2], [d.integer(1, 3), d.integer(1, 3)]])
    c["padding"] = [d.integer(0, 3), d.integer(0, 3)]
    c["dilation"] = [d.choice([1, 1, 2]), d.choice([1, 1, 2])]
    c["ceil"] = d.chance(0.3)
    c["dtype"] = d.choice(["uint8", "int8"])
    c["layout"] = d.choice(["channels_last", "contiguous", "strided"])
    return c


def _run_pool(c):
    g = _gen(c)
    dtype = DTYPES[c["dtype"]]
    lo, hi = R.QRANGE[dtype]
    x = _layout(torch.randint(lo, hi + 1, (c["n"], c["c"], c["h"], c["w"]), generator=g).to(dtype), c["layout"])
    stride = c["stride"] or c["kernel"]
    try:
        ref = F.max_pool2d(x.float(), c["kernel"], stride, c["padding"], c["dilation"], c["ceil"])
    except RuntimeError as e:
        c["_requires_error"] = f"aten max_pool2d raises: {str(e).splitlines()[0]}"
        ref = None
    if ref is not None and ref.numel() and torch.isinf(ref).any():
        c["_requires_error"] = "a window covers only padding (no integer maximum)"
    if ref is not None and ref.shape[2] * ref.shape[3] == 0:
        c["_requires_error"] = "the output would be empty"
    y = ops.max_pool2d(x, c["kernel"], c["stride"], c["padding"], c["dilation"], c["ceil"])
    if "_requires_error" in c:
        return
    _check_meta(y, dtype, ref.shape, "max_pool2d")
    if not torch.equal(y.float(), ref):
        raise Wrong("max_pool2d differs from aten's on the same integers")


# ----------------------------------------------------------------------------- driving

def draw_case(d, family: str, provider: str) -> dict:
    """One case of `family` on `provider` (a plain dict: JSON, printable, replayable)."""
    if family in ("linear", "linear_dynamic"):
        return _draw_linear(d, provider, family == "linear_dynamic")
    if family == "conv2d":
        return _draw_conv(d, provider)
    if family in ("quantize", "dequantize"):
        return _draw_quantize(d, family)
    if family == "embedding":
        return _draw_embedding(d, provider)
    if family == "layer_norm":
        return _draw_layer_norm(d)
    if family == "attention":
        return _draw_attention(d)
    if family == "max_pool2d":
        return _draw_pool(d)
    raise ValueError(f"unknown family {family!r}")


_RUN = {"linear": _run_linear, "linear_dynamic": _run_linear, "conv2d": _run_conv, "quantize": _run_quantize,
        "dequantize": _run_quantize, "embedding": _run_embedding, "layer_norm": _run_layer_norm,
        "attention": _run_attention, "max_pool2d": _run_pool}


def routing_refusal(case) -> str | None:
    """Why the router never sends this op instance to the case's provider (None: it may)."""
    p = case["provider"]
    if p not in PROVIDERS or p == "reference":
        return None
    if case["family"] == "conv2d":
        return PROVIDERS[p].refuses("conv2d", conv_shape_key(case))
    if case["family"] in ("linear", "linear_dynamic"):
        return PROVIDERS[p].refuses("linear", _linear_shape_key(case))
    return None


def clear_error(exc: BaseException, family: str) -> bool:
    """A clear error: ValueError / TypeError / RuntimeError naming an argument of the op."""
    return isinstance(exc, CLEAR_TYPES) and _ARG_RE[family].search(str(exc)) is not None


def run_case(case: dict) -> tuple[str, str]:
    """(outcome, detail) of one case (the outcomes of the module docstring)."""
    case = dict(case)
    refusal = routing_refusal(case)
    threads = torch.get_num_threads()
    try:
        _RUN[case["family"]](case)
    except Wrong as e:
        return ("refused", refusal) if refusal else ("wrong", str(e)[:400])
    except Exception as e:  # noqa: BLE001  (every other exception is classified below)
        if refusal:
            return "refused", refusal
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        if clear_error(e, case["family"]):
            return "error", msg
        return "wrong", "unclear error " + msg + " at " + traceback.format_exc().strip().splitlines()[-3][:200]
    finally:
        torch.set_num_threads(threads)
    if "_requires_error" in case:
        if refusal:
            return "refused", refusal
        return "wrong", "returned a result where an error is required: " + case["_requires_error"]
    if refusal:
        return "refused", refusal
    return "passed", ""
