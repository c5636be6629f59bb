"""Property tests: every provider of the int8 Conv2d agrees with the fp64 reference.

PackedConv2dWeight(w, w_scales, bias, stride, padding, dilation, groups, provider).conv2d(...) for
the native (where the CPU has VNNI), fbgemm and onednn providers, against
qbackend.ops.reference.conv2d (exact integer sums in fp64, padding with real zeros, exact erf gelu, round half to even), including the fused residual
add (accum) and the routes each provider takes: FBGEMM's depthwise / groupwise / pointwise / im2col
paths (its depthwise kernel must reroute 8-bit activations) and oneDNN's fused and unfused sums.

Acceptance rule (the same as test_linear.py's):
  * integer outputs (uint8/int8): |provider - reference| <= 1 LSB everywhere (requantization is
    fp32 in the kernels, fp64 in the reference, so an exact .5 tie may round the other way); fewer
    than 1% of the elements may be off by one (at most one element in outputs of fewer than 100
    elements), and every element that is off must be at a tie: its fp64 value, in output LSBs,
    lies within the fp32 tolerance below ((1e-5 * bound + 1e-6) / output_scale) of a .5 boundary.
  * fp32 outputs: |y - ref| <= 1e-5 * bound + 1e-6, where bound is the magnitude of the terms,
        bound = x_scale * w_scale[oc] * conv(|x - x_zp|, |w|) + |bias[oc]| (+ |dequantize(accum)|),
    computed in fp64 with F.conv2d on the absolute values (fp32 accumulation of exact int32 sums:
    relative error < 1e-5 against fp64 on the same integers).
  * bf16 outputs: |y - ref| <= 2**-8 * bound + 1e-6 (bf16 rounding).
  * post_op gelu: the same rules; the reference applies exact (erf) gelu.
Also: the output is channels-last (whatever the layout of x), and accum is not modified.

In-process tests follow the CPU they run on: where a provider does not multiply 8-bit activations
exactly (no VNNI, or QBACKEND_ISA caps it) they use 7-bit uint8 activations and no int8 ones. The
QBACKEND_ISA=avx2 / avx512 / avx512_vnni runs of the conv checks are in test_linear.py's
test_isa_classes (one child process per ISA runs both ops). torch's oneDNN conv takes uint8
activations only; qbackend's onednn_conv2d shifts int8 ones by +128 (test_onednn_int8_activations).
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qbackend.core.extension import usable_isa
from qbackend.ops import PROVIDERS, PackedConv2dWeight
from qbackend.ops import reference as R

from tests.ops.numerics import (CONV_FAST as FAST, NATIVE, HSET, OUT_DTYPES, POST_OPS, activations, all_threads,
                                  assert_rule, error_metrics, exact_8bit, log_uniform,
                                  output_scale_for, weights, zero_points)

pytestmark = pytest.mark.usefixtures("one_thread")

SLOW_HSET = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def conv_bound(pw, x, x_scale, x_zp, accum=None, accum_scale=1.0, accum_zp=0):
    """x_scale * w_scale * conv(|x - x_zp|, |w|) + |bias| (+ |dequantize(accum)|), in fp64."""
    t = F.conv2d((x.double() - int(x_zp)).abs(), pw.weight.double().abs(), None, pw.stride, pw.padding,
                 pw.dilation, pw.groups)
    b = t * R.f32(x_scale) * pw.w_scales.double().reshape(1, -1, 1, 1)
    if pw.bias is not None:
        b = b + pw.bias.double().abs().reshape(1, -1, 1, 1)
    if accum is not None:
        b = b + R.dequantize(accum, accum_scale, accum_zp).abs()
    return b


def reference_fp64(pw, x, x_scale, x_zp, post_op="none", accum=None, accum_scale=1.0, accum_zp=0):
    return R.conv2d_fp64(x, x_scale, x_zp, pw.weight, pw.w_scales, pw.bias, pw.stride, pw.padding, pw.dilation,
                         pw.groups, accum, accum_scale, accum_zp, post_op)


def check_conv(pw, x, x_scale, x_zp, span, out_zp, out_dtype, post_op="none", accum=None, accum_scale=1.0,
               accum_zp=0, what=""):
    """Runs pw.conv2d and asserts the rule against the reference (reference.conv2d is
    quantize(conv2d_fp64) for integer outputs, conv2d_fp64 for float ones), the channels-last output,
    and that x and accum are left alone; returns the metrics. The output scale puts the largest |y|
    `span` LSBs from zero (> 127: some outputs saturate)."""
    y64 = reference_fp64(pw, x, x_scale, x_zp, post_op, accum, accum_scale, accum_zp)
    out_scale = output_scale_for(y64, span)
    what = (f"{pw!r} x{tuple(x.shape)} {x.dtype} "
            f"{'channels-last' if x.is_contiguous(memory_format=torch.channels_last) else 'NCHW'} "
            f"zp={x_zp} scale={x_scale:.4g} -> {out_dtype} (scale={out_scale:.4g}, zp={out_zp}) post_op={post_op} "
            f"bias={pw.bias is not None} accum={None if accum is None else accum.dtype} {what}")
    x_before = x.clone()
    accum_before = None if accum is None else (accum.clone(), accum.stride())
    y = pw.conv2d(x, x_scale, x_zp, out_scale, out_zp, out_dtype, post_op, accum, accum_scale, accum_zp)
    assert y.dtype == out_dtype and y.shape == y64.shape, f"{what}: got {y.dtype} {tuple(y.shape)}"
    assert y.is_contiguous(memory_format=torch.channels_last), f"{what}: output is not channels-last"
    assert torch.equal(x, x_before), f"{what}: x was modified"
    if accum is not None:
        assert torch.equal(accum, accum_before[0]) and accum.stride() == accum_before[1], \
            f"{what}: accum was modified"
    m = error_metrics(y, y64, conv_bound(pw, x, x_scale, x_zp, accum, accum_scale, accum_zp), out_dtype,
                      out_scale, out_zp)
    assert_rule(m, what)
    return m


# ----------------------------------------------------------------------------- inputs

def out_hw(h, w, k, stride, padding, dilation):
    return ((h + 2 * padding[0] - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1,
            (w + 2 * padding[1] - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1)


# 3, 5, 17: not multiples of 8; 8, 16: FBGEMM's depthwise fast path (channels multiple of 8, "same" padding)
CHANNELS = st.one_of(st.sampled_from([1, 3, 5, 8, 16, 17]), st.integers(1, 17))
KERNELS = [(1, 1), (3, 3), (5, 5), (1, 3), (3, 1)]


ALL_KINDS = ("dense", "pointwise", "stem", "grouped", "depthwise", "depthwise_x2")
# groups 1, or depthwise with multiplier 1 (AVX512-VNNI's depthwise kernel, or AVX2's)
NATIVE_DEPTHWISE = int(usable_isa()) >= 1
NATIVE_KINDS = ("dense", "pointwise", "stem") + (("depthwise",) if NATIVE_DEPTHWISE else ())


@st.composite
def conv_geometry(draw, kinds=ALL_KINDS):
    """(kind, ic, oc, kernel, stride, padding, dilation, groups, n, h, w) of a valid conv."""
    kind = draw(st.sampled_from(kinds))
    pair = lambda lo, hi: (draw(st.integers(lo, hi)), draw(st.integers(lo, hi)))  # noqa: E731
    stride, padding, dilation, groups = pair(1, 2), pair(0, 2), pair(1, 2), 1
    if kind == "stem":  # ResNet-like 7x7 stride 2 on RGB
        ic, oc, kernel, stride, dilation = 3, draw(st.sampled_from([5, 8, 17])), (7, 7), (2, 2), (1, 1)
        padding = draw(st.sampled_from([(3, 3), (2, 3), (0, 0)]))
    elif kind == "pointwise":
        ic, oc, kernel, padding, dilation = draw(CHANNELS), draw(CHANNELS), (1, 1), (0, 0), (1, 1)
    elif kind == "dense":
        ic, oc, kernel = draw(CHANNELS), draw(CHANNELS), draw(st.sampled_from(KERNELS))
    elif kind == "grouped":
        groups = draw(st.sampled_from([2, 4]))
        ic, oc = groups * draw(st.integers(1, 5)), groups * draw(st.integers(1, 5))
        kernel = draw(st.sampled_from(KERNELS))
    else:  # depthwise: groups = IC, OC = IC or 2 * IC (channel multiplier 2)
        ic = groups = draw(CHANNELS)
        oc = ic * (2 if kind == "depthwise_x2" else 1)
        kernel = draw(st.sampled_from([(3, 3), (3, 3), (5, 5), (1, 3), (3, 1)]))
    n = draw(st.integers(1, 3))
    h, w = draw(st.integers(5, 15)), draw(st.integers(5, 15))
    # large enough for the (dilated) kernel
    h = max(h, dilation[0] * (kernel[0] - 1) + 1 - 2 * padding[0])
    w = max(w, dilation[1] * (kernel[1] - 1) + 1 - 2 * padding[1])
    return kind, ic, oc, kernel, stride, padding, dilation, groups, n, h, w


@st.composite
def conv_cases(draw, provider):
    exact = exact_8bit(provider)
    x_dtypes = [torch.uint8, torch.int8] if exact else [torch.uint8]
    c = {
        # The native provider runs convs with groups 1 (any kernel, stride, padding, dilation) and
        # depthwise ones with one filter per channel.
        "geometry": draw(conv_geometry(NATIVE_KINDS if provider == "native" else ALL_KINDS)),
        "x_dtype": draw(st.sampled_from(x_dtypes)),
        "x_mode": draw(st.sampled_from(["full", "ends", "near_zp", "seven_bit"])),
        "channels_last": draw(st.booleans()),
        "w_mode": draw(st.sampled_from(["full", "ends", "sparse"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "x_scale": R.f32(10 ** draw(st.floats(-3, 0))),
        "bias": draw(st.sampled_from([None, 1e-3, 1.0, 100.0])),
        "out_dtype": draw(st.sampled_from(OUT_DTYPES)),
        "post_op": draw(st.sampled_from(POST_OPS)),
        "accum": draw(st.sampled_from([None, None, torch.uint8, torch.int8])),
        "accum_scale": R.f32(10 ** draw(st.floats(-3, 0))),
        "span": draw(st.sampled_from([20.0, 100.0, 400.0])),
        "x_shape_hint": draw(st.booleans()),
    }
    # Without exact 8-bit products activations are 7-bit, and so is their zero point (the padding
    # holds it): an observer for such a CPU picks both in [0, 127].
    c["x_zp"] = draw(zero_points(c["x_dtype"]) if exact else st.integers(0, 127))
    c["out_zp"] = draw(zero_points(c["out_dtype"])) if c["out_dtype"] in R.QRANGE else 0
    c["accum_zp"] = draw(zero_points(c["accum"])) if c["accum"] is not None else 0
    return c


def onednn_refuses(provider, ic, oc, stride, groups):
    """The onednn provider refuses depthwise convs with a channel multiplier and unequal strides
    (oneDNN 3.12 computes some of them wrongly: test_onednn_known_bugs)."""
    return provider == "onednn" and groups == ic and oc > ic and stride[0] != stride[1]


def run_conv_case(provider, c):
    kind, ic, oc, kernel, stride, padding, dilation, groups, n, h, w = c["geometry"]
    g = torch.Generator().manual_seed(c["seed"])
    x = activations((n, ic, h, w), c["x_dtype"], c["x_zp"], c["x_mode"], not exact_8bit(provider), g)
    if c["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    wt = weights((oc, ic // groups, *kernel), c["w_mode"], g)
    ws = log_uniform(g, oc, -4, -1)
    bias = None if c["bias"] is None else torch.randn(oc, generator=g) * c["bias"]
    if onednn_refuses(provider, ic, oc, stride, groups):
        with pytest.raises(ValueError, match="channel multiplier and unequal strides"):
            PackedConv2dWeight(wt, ws, bias, stride, padding, dilation, groups, provider)
        return
    pw = PackedConv2dWeight(wt, ws, bias, stride, padding, dilation, groups, provider,
                            x_shape=list(x.shape) if c["x_shape_hint"] else None)
    accum = None
    if c["accum"] is not None:  # in the same memory layout as x
        accum = activations((n, oc, *out_hw(h, w, kernel, stride, padding, dilation)), c["accum"], c["accum_zp"],
                            "full", False, g)
        if c["channels_last"]:
            accum = accum.contiguous(memory_format=torch.channels_last)
    check_conv(pw, x, c["x_scale"], c["x_zp"], c["span"], c["out_zp"], c["out_dtype"], c["post_op"], accum,
               c["accum_scale"], c["accum_zp"], f"[{kind}] {c}")


# ----------------------------------------------------------------------------- property tests

@pytest.mark.parametrize("provider", FAST + NATIVE)
@HSET
@given(data=st.data())
def test_conv2d_matches_reference(provider, data):
    run_conv_case(provider, data.draw(conv_cases(provider)))


@pytest.mark.slow
@pytest.mark.parametrize("provider", FAST + NATIVE)
@SLOW_HSET
@given(data=st.data())
def test_conv2d_matches_reference_sweep(provider, data):
    run_conv_case(provider, data.draw(conv_cases(provider)))


# ----------------------------------------------------------------------------- fixed cases

# (name, ic, oc, kernel, stride, padding, dilation, groups, n, h, w)
FIXED = [
    ("dense3x3", 5, 17, (3, 3), (1, 1), (1, 1), (1, 1), 1, 2, 9, 7),
    ("pointwise", 17, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, 3, 7, 5),
    ("stem7x7s2", 3, 8, (7, 7), (2, 2), (3, 3), (1, 1), 1, 1, 15, 13),
    ("grouped", 8, 8, (3, 3), (1, 1), (1, 1), (1, 1), 4, 1, 9, 9),
    ("depthwise3x3", 16, 16, (3, 3), (1, 1), (1, 1), (1, 1), 16, 2, 9, 11),
    ("depthwise3x3_c17_s2", 17, 17, (3, 3), (2, 2), (1, 1), (1, 1), 17, 1, 9, 11),
    ("depthwise_x2_s2", 8, 16, (3, 3), (2, 2), (1, 1), (1, 1), 8, 1, 11, 9),
    ("depthwise5x5", 8, 8, (5, 5), (1, 1), (2, 2), (1, 1), 8, 1, 7, 9),
    ("asym", 5, 3, (3, 1), (2, 1), (1, 0), (2, 1), 1, 1, 11, 9),
    ("nonsquare1x3", 4, 6, (1, 3), (1, 2), (0, 1), (1, 2), 2, 3, 7, 11),
]


def native_runs(case):
    _, ic, oc, _, _, _, _, groups = case[:8]
    return groups == 1 or (NATIVE_DEPTHWISE and groups == ic == oc)


def cases_for(provider):
    """The fixed cases a provider runs (native: groups 1, or depthwise with one filter per channel)."""
    return [c for c in FIXED if provider != "native" or native_runs(c)]


def fixed_conv(case, provider, g, bias=True):
    name, ic, oc, kernel, stride, padding, dilation, groups, n, h, w = case
    if provider == "native" and not native_runs(case):
        pytest.skip("the native provider runs convs with groups 1 or depthwise ones with one filter per channel "
                    "(test_native.py checks it refuses others)")
    wt = weights((oc, ic // groups, *kernel), "full", g)
    b = torch.randn(oc, generator=g) if bias else None
    return PackedConv2dWeight(wt, log_uniform(g, oc, -3, -2), b, stride, padding, dilation, groups, provider), \
        (n, ic, h, w), out_hw(h, w, kernel, stride, padding, dilation)


@pytest.mark.parametrize("provider", FAST + NATIVE)
@pytest.mark.parametrize("case", FIXED, ids=[c[0] for c in FIXED])
def test_conv2d_every_combination(provider, case):
    """Every activation dtype x output dtype x post-op x residual (none, same dtype as the output:
    oneDNN's fused sum, other dtype: unfused) on each kind of conv, so no route depends on what
    hypothesis draws; the input layout and the zero point (both range ends) alternate. All failures
    are collected and reported together."""
    g = torch.Generator().manual_seed(7)
    pw, xshape, (oh, ow) = fixed_conv(case, provider, g)
    x_dtypes = [torch.uint8, torch.int8] if exact_8bit(provider) else [torch.uint8]
    failures = []
    i = 0
    for x_dtype in x_dtypes:
        lo, hi = R.QRANGE[x_dtype]
        if not exact_8bit(provider):  # 7-bit activations: zero points in [0, 127] too
            hi = 127
        x = activations(xshape, x_dtype, 0, "full", not exact_8bit(provider), g)
        layouts = (x.contiguous(memory_format=torch.channels_last), x.contiguous())
        for post_op in POST_OPS:
            for out_dtype in OUT_DTYPES:
                for accum_dtype in (None, torch.uint8, torch.int8):
                    i += 1
                    accum, a_zp = None, 0
                    if accum_dtype is not None:
                        a_zp = 7 if accum_dtype == torch.uint8 else -7
                        accum = activations((xshape[0], pw.out_channels, oh, ow), accum_dtype, a_zp, "full",
                                            False, g).contiguous(memory_format=torch.channels_last)
                    out_zp = {torch.uint8: 100, torch.int8: -20}.get(out_dtype, 0)
                    try:
                        check_conv(pw, layouts[i % 2], 0.03, (lo, hi)[(i // 2) % 2], 100.0, out_zp, out_dtype,
                                   post_op, accum, 0.05, a_zp)
                    except Exception as e:  # noqa: BLE001  (collect, then fail with all of them)
                        failures.append(f"{type(e).__name__}: {str(e).splitlines()[0][:400]}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


@pytest.mark.parametrize("provider", FAST + NATIVE)
def test_conv2d_nchw_and_channels_last_agree(provider):
    """The same values in NCHW-contiguous and channels-last memory give identical outputs."""
    g = torch.Generator().manual_seed(8)
    for case in cases_for(provider):
        pw, xshape, _ = fixed_conv(case, provider, g)
        x = activations(xshape, torch.uint8, 0, "full", not exact_8bit(provider), g)
        for out_dtype in (torch.uint8, torch.float32):
            y_cl = pw.conv2d(x.contiguous(memory_format=torch.channels_last), 0.02, 9, 0.1, 3, out_dtype, "relu")
            y_nchw = pw.conv2d(x.contiguous(), 0.02, 9, 0.1, 3, out_dtype, "relu")
            assert torch.equal(y_cl, y_nchw), (provider, case[0], out_dtype)


@pytest.mark.parametrize("case", [c for c in FIXED if c[0].startswith("depthwise")], ids=lambda c: c[0])
def test_fbgemm_depthwise_8bit_activations(case):
    """FBGEMM's depthwise kernel saturates 16-bit intermediates on activations above 127; the
    provider must reroute those (with VNNI) and still be within the rule, for integer outputs
    (the fast path's candidates) at the extremes: x all 255, zero points 0, 128 and 255; and 7-bit
    x with zero points up to 127 (the fast path itself)."""
    g = torch.Generator().manual_seed(9)
    pw, xshape, _ = fixed_conv(case, "fbgemm", g)
    seven = not exact_8bit("fbgemm")
    if seven:
        pytest.skip("without VNNI, 8-bit activations are refused (7-bit rule): nothing to reroute")
    hi = 127 if seven else 255
    inputs = [(activations(xshape, torch.uint8, 0, "full", seven, g), (0, 128, 255)),
              (activations(xshape, torch.uint8, 0, "ends", seven, g), (0, 128, 255)),
              (torch.full(xshape, hi, dtype=torch.uint8), (0, 128, 255)),
              # all 7-bit: the fast path itself (zero points above 127 with padding:
              # test_conv2d_padding_holds_zero_point_above_127)
              (torch.zeros(xshape, dtype=torch.uint8), (0, 127)),
              (activations(xshape, torch.uint8, 0, "seven_bit", True, g), (0, 60, 127))]
    failures = []
    for x, zps in inputs:
        x = x.contiguous(memory_format=torch.channels_last)
        for x_zp in zps:
            for out_dtype, post_op in [(torch.uint8, "none"), (torch.int8, "relu"), (torch.uint8, "relu")]:
                try:
                    check_conv(pw, x, 0.01, x_zp, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, post_op)
                except AssertionError as e:
                    failures.append(str(e).splitlines()[0][:400])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


@pytest.mark.parametrize("case", [c for c in FIXED if c[0].startswith("depthwise") and c[1] == c[2]],
                         ids=lambda c: c[0])
def test_onednn_depthwise_exact_at_8_bits_on_every_isa(case):
    """oneDNN's depthwise convs do not pair products in int16: full-range 8-bit activations (all 255,
    the extremes, zero points 0 / 128 / 255, int8 x) are within the rule of the fp64 reference on
    every ISA, without VNNI too (CI's QBACKEND_ISA=avx2 rerun), where routing and the observers rely
    on it (ops.providers._onednn_exact, csrc/common/saturation.h)."""
    g = torch.Generator().manual_seed(11)
    pw, xshape, _ = fixed_conv(case, "onednn", g)
    assert PROVIDERS["onednn"].exact_8bit("conv2d", {"groups": pw.groups, "c_in": pw.in_channels,
                                                     "c_out": pw.out_channels})
    inputs = [(activations(xshape, torch.uint8, 0, "full", False, g), (0, 128, 255)),
              (activations(xshape, torch.uint8, 0, "ends", False, g), (0, 255)),
              (torch.full(xshape, 255, dtype=torch.uint8), (0, 3)),
              (activations(xshape, torch.int8, 0, "full", False, g), (-128, 0, 127))]
    for x, zps in inputs:
        x = x.contiguous(memory_format=torch.channels_last)
        for x_zp in zps:
            for out_dtype, post_op in [(torch.uint8, "none"), (torch.int8, "relu"), (torch.float32, "none")]:
                check_conv(pw, x, 0.01, x_zp, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, post_op)


@pytest.mark.parametrize("provider", FAST + NATIVE)
def test_conv2d_padding_holds_zero_point_above_127(provider):
    """Padding holds x_zp (the real zero) in the quantized domain. With 7-bit activations and a
    zero point above 127 the padded value is the only 8-bit value the kernel multiplies (likewise
    negative int8 x with a zero point >= 0, once shifted to uint8 by +128): the result
    must be within the rule, or, where the provider takes only 7-bit activations (no VNNI), the call
    may be refused with ValueError instead. All failures are collected and reported together."""
    g = torch.Generator().manual_seed(16)
    failures = []
    for case in [c for c in cases_for(provider) if max(c[5]) > 0]:
        pw, xshape, _ = fixed_conv(case, provider, g)
        x = activations(xshape, torch.uint8, 0, "seven_bit", True, g).contiguous(memory_format=torch.channels_last)
        inputs = [(x, x_zp) for x_zp in (128, 200, 255)]
        if exact_8bit(provider):  # int8 x: kernels that shift it by +128 see
            xn = -1 - activations(xshape, torch.uint8, 0, "seven_bit", True, g).to(torch.int8)  # x < 0, zp >= 0
            inputs += [(xn.contiguous(memory_format=torch.channels_last), x_zp) for x_zp in (0, 72, 127)]
        for x, x_zp in inputs:
            for out_dtype in (torch.uint8, torch.float32):
                try:
                    check_conv(pw, x, 0.01, x_zp, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, "none")
                except ValueError as e:
                    if exact_8bit(provider):
                        failures.append(f"{case[0]} x_zp={x_zp} -> {out_dtype}: ValueError: {e}")
                except AssertionError as e:
                    failures.append(str(e).splitlines()[0][:400])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_onednn_weight_packed_with_nominal_activation_qparams():
    """oneDNN prepacks conv weights with nominal x qparams (scale 1, zero point 0): the same packed
    weight must be right for any x_scale / x_zero_point at run time."""
    g = torch.Generator().manual_seed(10)
    seven = not exact_8bit("onednn")
    for case in (FIXED[0], FIXED[2], FIXED[4]):
        pw, xshape, (oh, ow) = fixed_conv(case, "onednn", g)
        x = activations(xshape, torch.uint8, 0, "full", seven, g).contiguous(memory_format=torch.channels_last)
        accum = activations((xshape[0], pw.out_channels, oh, ow), torch.uint8, 0, "full", False, g)
        accum = accum.contiguous(memory_format=torch.channels_last)
        for x_scale, x_zp in [(1.0, 0), (1e-3, 0), (0.02, 128), (0.5, 255), (3.7, 3), (0.0123, 77)]:
            if seven and x_zp > 127:  # 7-bit activations have 7-bit zero points
                continue
            for out_dtype, post_op, acc in [(torch.uint8, "none", None), (torch.int8, "relu", None),
                                            (torch.float32, "none", None), (torch.uint8, "relu", accum)]:
                check_conv(pw, x, x_scale, x_zp, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, post_op,
                           acc, 0.04, 100, f"(nominal packing, x_scale={x_scale}, x_zp={x_zp})")


@pytest.mark.parametrize("provider", FAST + NATIVE)
def test_conv2d_large_multithreaded(provider):
    """Large enough for FBGEMM's multi-task split (>= 2**22 MACs); many elements for the
    off-by-one fraction."""
    g = torch.Generator().manual_seed(11)
    wt = weights((32, 32, 3, 3), "full", g)
    pw = PackedConv2dWeight(wt, log_uniform(g, 32, -3, -2), torch.randn(32, generator=g), 1, 1, 1, 1, provider)
    x = activations((2, 32, 17, 16), torch.uint8, 0, "full", not exact_8bit(provider), g)
    x = x.contiguous(memory_format=torch.channels_last)
    accum = activations((2, 32, 17, 16), torch.uint8, 0, "full", False, g).contiguous(memory_format=torch.channels_last)
    with all_threads():
        for out_dtype in OUT_DTYPES:
            for post_op, acc in [("none", None), ("relu", None), ("gelu", None), ("relu", accum)]:
                check_conv(pw, x, 0.01, 120, 100.0, 128 if out_dtype == torch.uint8 else 0, out_dtype, post_op, acc,
                           0.1, 128)


@pytest.mark.parametrize("provider", FAST + NATIVE)
def test_conv2d_empty_batch(provider):
    g = torch.Generator().manual_seed(12)
    pw, (n, ic, h, w), (oh, ow) = fixed_conv(FIXED[0], provider, g)
    for out_dtype in OUT_DTYPES:
        y = pw.conv2d(torch.zeros((0, ic, h, w), dtype=torch.uint8), 0.1, 0, 0.1, 0, out_dtype, "relu")
        assert y.dtype == out_dtype and tuple(y.shape) == (0, pw.out_channels, oh, ow)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_onednn_int8_activations(out_dtype):
    """int8 activations on the onednn provider (shifted to uint8 by qbackend, since torch's oneDNN
    conv refuses int8), plain and with an int8 residual (fused sum)."""
    if not exact_8bit("onednn"):
        pytest.skip("int8 activations need VNNI (the 7-bit rule refuses them; see test_isa_classes)")
    g = torch.Generator().manual_seed(13)
    for case in (FIXED[0], FIXED[4]):
        pw, xshape, (oh, ow) = fixed_conv(case, "onednn", g)
        x = activations(xshape, torch.int8, 0, "full", False, g).contiguous(memory_format=torch.channels_last)
        for accum_dtype in (None, torch.int8):
            accum = None if accum_dtype is None else activations((xshape[0], pw.out_channels, oh, ow), accum_dtype,
                                                                 0, "full", False, g)
            check_conv(pw, x, 0.02, -5, 100.0, 0, out_dtype, "relu", accum, 0.05, 3)


def test_onednn_known_bugs():
    """Regressions for two oneDNN 3.12 depthwise bugs found by the property tests.
    1. kernel 1 along a padded dimension (1x3, padding (1, 0)): oneDNN's zero-point compensation is
       wrong at the border (up to 600 LSB); qbackend writes the padding out and must be exact.
    2. channel multiplier 2, kernel 1x5, stride (1, 2), output width 1: wrong even with zero point 0;
       the onednn provider refuses the configuration (ValueError) and fbgemm runs it exactly."""
    g = torch.Generator().manual_seed(21)
    seven = not exact_8bit("onednn")
    for kernel, padding in (((1, 3), (1, 0)), ((1, 1), (2, 0)), ((3, 1), (0, 2))):
        wt = weights((16, 1, *kernel), "full", g)
        pw = PackedConv2dWeight(wt, log_uniform(g, 16, -3, -2), None, 1, padding, 1, 16, "onednn")
        x = activations((1, 16, 6, 6), torch.uint8, 0, "full", seven, g).contiguous(memory_format=torch.channels_last)
        for x_zp in ((0, 100, 127) if seven else (0, 100, 255)):
            check_conv(pw, x, 0.02, x_zp, 100.0, 0, torch.float32, "none")
    wt = weights((32, 1, 1, 5), "full", g)
    ws = log_uniform(g, 32, -3, -2)
    with pytest.raises(ValueError, match="channel multiplier and unequal strides"):
        PackedConv2dWeight(wt, ws, None, (1, 2), 0, 1, 16, "onednn")
    pw = PackedConv2dWeight(wt, ws, None, (1, 2), 0, 1, 16, "fbgemm")
    x = activations((1, 16, 7, 6), torch.uint8, 0, "full", not exact_8bit("fbgemm"), g)
    check_conv(pw, x.contiguous(memory_format=torch.channels_last), 0.02, 3, 100.0, 0, torch.float32, "none")


def test_reference_provider_is_reference_conv2d():
    g = torch.Generator().manual_seed(14)
    pw, xshape, (oh, ow) = fixed_conv(FIXED[3], "reference", g)
    x = activations(xshape, torch.uint8, 0, "full", False, g)
    accum = activations((xshape[0], pw.out_channels, oh, ow), torch.int8, 0, "full", False, g)
    for out_dtype in OUT_DTYPES:
        y = pw.conv2d(x, 0.02, 5, 0.1, 3, out_dtype, "gelu", accum, 0.05, -2)
        ref = R.conv2d(x, 0.02, 5, pw.weight, pw.w_scales, pw.bias, pw.stride, pw.padding, pw.dilation, pw.groups,
                       0.1, 3, out_dtype, "gelu", accum, 0.05, -2)
        assert torch.equal(y, ref if out_dtype in R.QRANGE else ref.to(out_dtype))
        assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("provider", FAST)
def test_conv2d_pickle_deepcopy_with_provider(provider):
    g = torch.Generator().manual_seed(15)
    for case in (FIXED[0], FIXED[5], FIXED[7]):
        pw, xshape, (oh, ow) = fixed_conv(case, provider, g)
        x = activations(xshape, torch.uint8, 0, "full", not exact_8bit(provider), g)
        x = x.contiguous(memory_format=torch.channels_last)
        accum = activations((xshape[0], pw.out_channels, oh, ow), torch.uint8, 0, "full", False, g)
        copies = [pickle.loads(pickle.dumps(pw)), copy.deepcopy(pw)]
        for out_dtype, post_op, acc in [(torch.uint8, "relu", None), (torch.int8, "none", None),
                                        (torch.float32, "gelu", None), (torch.bfloat16, "none", None),
                                        (torch.uint8, "relu", accum)]:
            y = pw.conv2d(x, 0.02, 100, 0.05, 10, out_dtype, post_op, acc, 0.1, 3)
            for cp in copies:
                assert cp.provider_name == provider and cp.packed is not pw.packed
                assert (cp.stride, cp.padding, cp.dilation, cp.groups) == (pw.stride, pw.padding, pw.dilation,
                                                                             pw.groups)
                assert torch.equal(cp.conv2d(x, 0.02, 100, 0.05, 10, out_dtype, post_op, acc, 0.1, 3), y)
        for other in FAST + ["reference"]:
            moved = pw.with_provider(other)
            assert moved.provider_name == other and pw.provider_name == provider
            xo = x if exact_8bit(other) else x.clamp(max=127)
            for out_dtype in OUT_DTYPES:
                check_conv(moved, xo, 0.02, 100, 100.0, 10, out_dtype, "relu", accum, 0.1, 3,
                           f"(with_provider from {provider})")
