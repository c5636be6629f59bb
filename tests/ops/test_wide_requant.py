"""The AMX kernel's 64-column requantizing epilogue (csrc/kernels/gemm_amx.cpp, `requant64`): a row's
four full vectors narrowed by two saturating packs, out_zp added in int16, relu as a byte maximum and
one dword permutation back to column order, from tiles that start at -a_zp x colsum. It runs where
a panel has all 64 columns, K <= 256 and integer output without gelu; a panel of 63 columns takes
the 16-column epilogue. The same weight columns through both must give the same bytes on the AMX
tiles (where this CPU has them) and their emulation, for every output type, zero point at the ends
of its range, relu, residuals of either type, values far beyond the output range (beyond int16, and
beyond int32 after scaling) and every block height; the bytes stay within 1 LSB of the fp64
reference. The VNNI register tiles (16-column epilogue only) are held to the same checks.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from qbackend.ops import reference as R
from tests.ops.numerics import all_threads
from tests.ops.test_native_kernels import native_kernel

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(int(_C.usable_isa()) < 3, reason="the 64-column epilogue is AVX512 code")]

CL = torch.channels_last
# "" = the provider's own choice (AMX where the CPU has it, else AVX512-VNNI)
KERNELS = ["", "amx_emulated", "avx512_vnni"]
OUTPUTS = [(torch.uint8, 0), (torch.uint8, 255), (torch.uint8, 131), (torch.int8, -128), (torch.int8, 127),
           (torch.int8, -3)]


def _kernel(name):
    """test_native_kernels.native_kernel (which checks the switch took), or no switch for ""."""
    return native_kernel(name) if name else contextlib.nullcontext()


def _case(g, rows, c, x_dtype):
    """x [1, c, rows, 1] and a weight of 64 output channels with scales and a bias whose columns 0-3
    put the output far above / below the range (beyond int16 after scaling), just above / below it."""
    lo, hi = (0, 256) if x_dtype == torch.uint8 else (-128, 128)
    x = torch.randint(lo, hi, (1, c, rows, 1), dtype=x_dtype, generator=g).contiguous(memory_format=CL)
    w = torch.randint(-128, 128, (64, c, 1, 1), dtype=torch.int8, generator=g)
    ws = torch.rand(64, generator=g) * 0.01 + 1e-3
    ws[:4] = 1e-9
    bias = torch.randn(64, generator=g)
    bias[:4] = torch.tensor([1e4, -1e4, 0.05 * 400, -0.05 * 400])
    return x, w, ws, bias


def _conv(w, ws, bias, x, x_zp, out_scale, out_dtype, out_zp, post, accum=None, accum_zp=0):
    pw = PackedConv2dWeight(w, ws, bias, (1, 1), (0, 0), (1, 1), 1, "native")
    if accum is None:
        return pw.conv2d(x, 0.02, x_zp, out_scale, out_zp, out_dtype, post)
    return pw.conv2d(x, 0.02, x_zp, out_scale, out_zp, out_dtype, post, accum, 0.07, accum_zp)


def _residual(g, rows, dtype):
    if dtype is None:
        return None, 0
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    r = torch.randint(lo, hi, (1, 64, rows, 1), dtype=dtype, generator=g).contiguous(memory_format=CL)
    return r, 7 if dtype == torch.uint8 else -7


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("c", [64, 100, 30])
def test_64_columns_give_the_bytes_of_63(kernel, c):
    """C = 64 (tiles only), 100 (a K tail on VNNI), 30 (VNNI only, on every kernel); rows 1-6
    (register tiles), 16, 32, 45 (AMX blocks and a VNNI remainder), 70."""
    g = torch.Generator().manual_seed(c)
    for rows in (1, 5, 6, 16, 32, 45, 70):
        for x_dtype, x_zp in ((torch.uint8, 128), (torch.int8, -5)):
            x, w, ws, bias = _case(g, rows, c, x_dtype)
            for out_dtype, out_zp in OUTPUTS:
                qmin, qmax = (0, 255) if out_dtype == torch.uint8 else (-128, 127)
                for post in ("none", "relu"):
                    floor = max(qmin, out_zp) if post == "relu" else qmin
                    for res_dtype in (None, torch.uint8, torch.int8):
                        r, r_zp = _residual(g, rows, res_dtype)
                        with _kernel(kernel):
                            wide = _conv(w, ws, bias, x, x_zp, 0.05, out_dtype, out_zp, post, r, r_zp)
                            narrow = _conv(w[:63], ws[:63], bias[:63], x, x_zp, 0.05, out_dtype, out_zp, post,
                                           None if r is None else r[:, :63], r_zp)
                        what = f"rows={rows} x={x_dtype} out={out_dtype} zp={out_zp} {post} res={res_dtype}"
                        assert torch.equal(wide[:, :63], narrow), what
                        ref = R.conv2d(x, 0.02, x_zp, w, ws, bias, (1, 1), (0, 0), (1, 1), 1, 0.05, out_zp,
                                       out_dtype, post, r, 0.07, r_zp)
                        assert int((wide.int() - ref.int()).abs().max()) <= 1, what
                        if r is None:  # the saturating columns (a residual may pull 2 and 3 back in range)
                            assert wide[0, :4].flatten(1).tolist() == [[qmax] * rows, [floor] * rows] + \
                                [[qmax] * rows, [floor] * rows], what


@pytest.mark.parametrize("kernel", KERNELS)
def test_values_beyond_int32_saturate(kernel):
    """An output scale of 1e-30 puts every value beyond int32 after scaling (cvtps_epi32 would give
    INT_MIN): positives saturate to the top of the range, negatives to the bottom (relu: out_zp)."""
    g = torch.Generator().manual_seed(7)
    x, w, ws, _ = _case(g, 45, 64, torch.uint8)
    for out_dtype, out_zp in OUTPUTS:
        for post in ("none", "relu"):
            with _kernel(kernel):
                wide = _conv(w, ws, None, x, 128, 1e-30, out_dtype, out_zp, post)
                narrow = _conv(w[:63], ws[:63], None, x, 128, 1e-30, out_dtype, out_zp, post)
            assert torch.equal(wide[:, :63], narrow)
            ref = R.conv2d(x, 0.02, 128, w, ws, None, (1, 1), (0, 0), (1, 1), 1, 1e-30, out_zp, out_dtype, post)
            assert torch.equal(wide, ref), f"{out_dtype} zp={out_zp} {post}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_thread_splits_and_several_panels(kernel):
    """Three panels of 64 (each takes the 64-column epilogue) and a fourth of 20 (16-column), rows split
    over the threads: within 1 LSB of the fp64 reference."""
    g = torch.Generator().manual_seed(11)
    c, oc = 96, 212
    x = torch.randint(0, 256, (3, c, 20, 20), dtype=torch.uint8, generator=g).contiguous(memory_format=CL)
    w = torch.randint(-128, 128, (oc, c, 1, 1), dtype=torch.int8, generator=g)
    ws, bias = torch.rand(oc, generator=g) * 0.01 + 1e-3, torch.randn(oc, generator=g)
    acc = torch.randint(0, 256, (3, oc, 20, 20), dtype=torch.uint8, generator=g).contiguous(memory_format=CL)
    with _kernel(kernel), all_threads():
        got = _conv(w, ws, bias, x, 120, 0.08, torch.uint8, 60, "relu", acc, 9)
    ref = R.conv2d(x, 0.02, 120, w, ws, bias, (1, 1), (0, 0), (1, 1), 1, 0.08, 60, torch.uint8, "relu", acc, 0.07, 9)
    assert int((got.int() - ref.int()).abs().max()) <= 1
