"""The native provider's Winograd route for 3x3 stride-1 convs (csrc/kernels/winograd_avx2.cpp,
csrc/providers/native_winograd.cpp) on the AVX2 kernels (any AVX2 CPU: set_native_kernel("avx2")).

Its sums are exact integers (winograd_kernels.h), so every output must be byte-identical to the GEMM
over gathered taps on the same packed weight (the route switched off), for every geometry, padding,
input and output type, post-op, residual and thread split; the float outputs are also held to an
fp64 reference on the same integers, and the largest channel count to the int32 bound."""
from __future__ import annotations

import contextlib

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from tests.ops.numerics import all_threads, use_native_kernel

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")]
CL = torch.channels_last


@pytest.fixture(params=["avx2"])
def avx2_kernel(request):
    yield from use_native_kernel(request)


@contextlib.contextmanager
def winograd(enabled: bool):
    before = _C.native_winograd_enabled()
    _C.set_native_winograd(enabled)
    try:
        yield
    finally:
        _C.set_native_winograd(before)


def _conv(batch, c, oc, h, w, pad, x_dtype, g, w_max=127):
    wt = torch.randint(-w_max - 1, w_max + 1, (oc, c, 3, 3), dtype=torch.int8, generator=g)
    wt[0, 0, 0, 0] = -128 if w_max == 127 else -w_max
    ws = torch.rand(oc, generator=g) * 0.01 + 1e-3
    b = torch.randn(oc, generator=g)
    lo, hi = (0, 256) if x_dtype == torch.uint8 else (-128, 128)
    x = torch.randint(lo, hi, (batch, c, h, w), dtype=x_dtype, generator=g)
    x.view(-1)[0] = hi - 1
    x = x.contiguous(memory_format=CL)
    zp = int(torch.randint(lo, hi, (), generator=g))
    pw = PackedConv2dWeight(wt, ws, b, (1, 1), (pad, pad), (1, 1), 1, "native", x_shape=list(x.shape),
                            x_qparams=(0.02, zp))
    return wt, ws, b, x, zp, pw


def _both_routes(fn):
    """fn() on the Winograd route (checked taken) and on the GEMM (the route off at call time)."""
    calls = _C.native_winograd_calls()
    y_w = fn()
    assert _C.native_winograd_calls() > calls, "the Winograd route was not taken"
    with winograd(False):
        y_g = fn()
    return y_w, y_g


GEOMETRIES = [  # batch, in channels, out channels, h, w, padding (outputs from 12 x 12: the route's)
    (1, 64, 64, 14, 14, 1), (2, 19, 5, 13, 15, 1), (3, 17, 33, 14, 15, 0), (2, 40, 20, 11, 12, 2),
    (1, 16, 1, 13, 13, 1), (1, 16, 16, 12, 17, 1), (2, 31, 70, 12, 13, 1), (1, 130, 24, 16, 16, 1),
    (2, 64, 48, 30, 30, 1), (1, 130, 60, 24, 24, 1), (1, 200, 40, 20, 20, 1)]  # the last three: several blocks
    # with the whole filter in one group; three groups of the filter's vectors; large blocks


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("x_dtype", [torch.uint8, torch.int8])
def test_outputs_equal_the_gemm_route(avx2_kernel, geometry, x_dtype):
    """Every output type and post-op, odd sizes (partial tiles at the right and bottom), channel counts
    off 16 and 2, padding 0-2: the same bytes as the GEMM route."""
    g = torch.Generator().manual_seed(sum(geometry))
    batch, c, oc, h, w, pad = geometry
    _, _, _, x, zp, pw = _conv(batch, c, oc, h, w, pad, x_dtype, g)
    for out_dtype, post in ((torch.uint8, "relu"), (torch.int8, "none"), (torch.float32, "none"),
                            (torch.bfloat16, "relu"), (torch.float32, "gelu"), (torch.uint8, "gelu")):
        out_zp = {torch.uint8: 3, torch.int8: -5}.get(out_dtype, 0)
        y_w, y_g = _both_routes(lambda: pw.conv2d(x, 0.02, zp, 0.1, out_zp, out_dtype, post))
        assert torch.equal(y_w, y_g), f"{out_dtype} {post}"


@pytest.mark.parametrize("geometry", GEOMETRIES[:4], ids=lambda t: "x".join(map(str, t)))
def test_float_outputs_match_the_fp64_reference(avx2_kernel, geometry):
    """float32 outputs against fp64 math on the same integers: sum (x - zp) * w, then scale and bias."""
    g = torch.Generator().manual_seed(7 + sum(geometry))
    batch, c, oc, h, w, pad = geometry
    wt, ws, b, x, zp, pw = _conv(batch, c, oc, h, w, pad, torch.uint8, g)
    calls = _C.native_winograd_calls()
    y = pw.conv2d(x, 0.02, zp, 1.0, 0, torch.float32, "none")
    assert _C.native_winograd_calls() > calls
    sums = torch.nn.functional.conv2d(x.double() - zp, wt.double(), padding=pad)
    ref = sums * (0.02 * ws.double()).view(1, -1, 1, 1) + b.double().view(1, -1, 1, 1)
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-4)


def test_residual_add_and_threads_equal_the_gemm_route(avx2_kernel):
    g = torch.Generator().manual_seed(3)
    _, _, _, x, zp, pw = _conv(2, 48, 40, 15, 13, 1, torch.uint8, g)
    acc = torch.randint(-128, 128, (2, 40, 15, 13), dtype=torch.int8, generator=g).contiguous(memory_format=CL)
    for threads in (False, True):
        with all_threads() if threads else contextlib.nullcontext():
            y_w, y_g = _both_routes(lambda: pw.conv2d_add_(x, 0.02, zp, 0.1, 2, torch.int8, "relu", acc.clone(),
                                                           0.05, -3))
        assert torch.equal(y_w, y_g), f"threads={threads}"


def test_largest_channel_count_sums_exactly(avx2_kernel):
    """C = 1824 (the int32 bound: 4 x 9 x C x 255 x 128 < 2^31) with x = 255, zp = 0 and w = -128
    everywhere, no padding (every tap present): the GEMM route's bytes, and the exact sum itself."""
    c = 1824
    wt = torch.full((16, c, 3, 3), -128, dtype=torch.int8)
    wt[1] = 127
    x = torch.full((1, c, 14, 14), 255, dtype=torch.uint8).contiguous(memory_format=CL)  # 12 x 12 outputs
    pw = PackedConv2dWeight(wt, torch.ones(16), None, (1, 1), (0, 0), (1, 1), 1, "native", x_shape=list(x.shape),
                            x_qparams=(1.0, 0))
    y_w, y_g = _both_routes(lambda: pw.conv2d(x, 1.0, 0, 1.0, 0, torch.float32, "none"))
    assert torch.equal(y_w, y_g)
    assert float(y_w[0, 0, 0, 0]) == float(torch.tensor(9 * c * 255 * -128, dtype=torch.float32))
    assert float(y_w[0, 1, 1, 1]) == float(torch.tensor(9 * c * 255 * 127, dtype=torch.float32))


def test_where_the_route_does_not_apply(avx2_kernel):
    """More channels than the bound or fewer than 16, stride 2, dilation 2, or an output under
    12 x 12: the GEMM route (no Winograd call), with the reference's sums."""
    g = torch.Generator().manual_seed(5)
    cases = [((1825, 8, 6, 6), (1, 1), (1, 1)), ((15, 8, 12, 12), (1, 1), (1, 1)), ((16, 16, 12, 12), (2, 2), (1, 1)),
             ((16, 16, 12, 12), (1, 1), (2, 2)),
             ((16, 16, 11, 30), (1, 1), (1, 1))]  # the last: 11 output rows
    for (c, oc, h, w), stride, dilation in cases:
        wt = torch.randint(-128, 128, (oc, c, 3, 3), dtype=torch.int8, generator=g)
        x = torch.randint(0, 256, (1, c, h, w), dtype=torch.uint8, generator=g).contiguous(memory_format=CL)
        pw = PackedConv2dWeight(wt, torch.ones(oc), None, stride, (1, 1), dilation, 1, "native",
                                x_shape=list(x.shape), x_qparams=(1.0, 7))
        calls = _C.native_winograd_calls()
        y = pw.conv2d(x, 1.0, 7, 1.0, 0, torch.float32, "none")
        assert _C.native_winograd_calls() == calls, (c, stride, dilation)
        ref = torch.nn.functional.conv2d(x.double() - 7, wt.double(), stride=stride, padding=1, dilation=dilation)
        assert torch.equal(y.double(), ref.float().double())


def test_a_winograd_packed_weight_is_checked(avx2_kernel):
    """A packed weight carrying the Winograd filter loads its size from the header: one byte short
    is refused with a ValueError naming the argument."""
    g = torch.Generator().manual_seed(9)
    _, _, _, x, zp, pw = _conv(1, 16, 16, 12, 12, 1, torch.uint8, g)
    packed = pw.packed
    short = packed.reshape(-1)[:-9].reshape(3, 3, -1)
    with pytest.raises(ValueError, match="w_packed"):
        torch.ops.qbackend.native_conv2d(x, 0.02, zp, short, pw.w_scales, pw.bias, [1, 1], [1, 1], [1, 1], 1, 0.1, 3,
                                         torch.uint8, "relu", None, 1.0, 0)


_MODEL_CHILD = r"""
import json, os, tempfile, warnings
import torch, qbackend
from torch import nn
from qbackend.core.extension import _C
warnings.simplefilter("ignore")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(32, 32, 3, stride=2, padding=1)).eval()
g = torch.Generator().manual_seed(1)
cal = [torch.randn(2, 16, 16, 16, generator=g) for _ in range(3)]
x = torch.randn(2, 16, 16, 16, generator=g)
q = qbackend.quantize(model, (cal[0],), cal)
layers = [m for m in q.modules() if type(m).__name__ == "QuantizedConv2d"]
with torch.no_grad():
    ref = model(x)
    calls = _C.native_winograd_calls()
    y = q(x)
    calls = _C.native_winograd_calls() - calls
    _C.set_native_winograd(False)
    y_gemm = q(x)
    _C.set_native_winograd(True)
    path = os.path.join(tempfile.mkdtemp(), "m.qb")
    qbackend.save(q, path)
    before = _C.native_winograd_calls()
    y_loaded = qbackend.load(path)(x)
    loaded_calls = _C.native_winograd_calls() - before
print(json.dumps({"isa": qbackend.cpu_features().isa_class, "calls": calls, "loaded_calls": loaded_calls,
                  "max_w": [int(m.packed.weight.int().abs().max()) for m in layers],
                  "same": bool(torch.equal(y, y_gemm)), "loaded_same": bool(torch.equal(y, y_loaded)),
                  "sqnr": float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum()))}))
"""


def test_a_model_runs_its_3x3_convs_on_the_route_with_8_bit_weights():
    """On the AVX2 class (QBACKEND_ISA=avx2): a model's 3x3 stride-1 convs keep 8-bit weights (the
    rule table leaves them out of the 7-bit weights) and run on the Winograd route, also after a save
    and load; the strided one gets 7 bits (the pair products); the same output as the GEMM route."""
    from tests.subprocess_utils import run_py
    import json

    proc = run_py(_MODEL_CHILD, env={"QBACKEND_ISA": "avx2"}, timeout=300, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["isa"] == "avx2"
    assert res["calls"] == 2 and res["loaded_calls"] == 2, res
    assert [w > 64 for w in res["max_w"]] == [True, True, False], res
    assert res["same"] and res["loaded_same"], res
    assert res["sqnr"] > 30, res
