"""qbackend::native_inverted_residual: the fused block equals the three native conv ops called in
turn, bit for bit, on every geometry (expansion or none, stride 1 and 2, kernels 3 and 5, residual,
uint8 and int8 at every stage, float output, odd sizes and channel counts, batch 0, 1 and more than
the threads, one thread and two); its output is within 1 LSB at ties of the fp64 chain; its fake
impl passes opcheck; bad arguments are ValueErrors or TypeErrors naming the argument."""
from __future__ import annotations

import pytest
import torch

from qbackend.core.extension import _C
from qbackend.ops import reference as R

from .numerics import NATIVE_KERNELS, all_threads, use_native_kernel

pytestmark = pytest.mark.skipif(not _C.native_isa(), reason="the fused block needs the native kernels (AVX2)")
ops = torch.ops.qbackend


@pytest.fixture(autouse=True, params=NATIVE_KERNELS, ids=lambda k: k or "cpu_choice")
def native_kernel(request):
    """This CPU's kernels, and the AVX2 GEMM and depthwise kernels where those are others."""
    yield from use_native_kernel(request)


def _pack(w, stride=1, padding=0, groups=1):
    return ops.native_conv2d_prepack(w, [stride, stride], [padding, padding], [1, 1], groups)


def _qparams(dtype, zp_u8, zp_s8):
    return zp_u8 if dtype == torch.uint8 else zp_s8


class Block:
    """Random int8 weights and qparams for one block, its packed weights and its op arguments."""

    def __init__(self, n, c_in, hw, t, c_out, k=3, stride=1, residual=False, x_dtype=torch.uint8,
                 mid_dtype=torch.uint8, out_dtype=torch.uint8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.expand = t > 1
        cm = c_in * t if self.expand else c_in
        h, w = hw
        xu = torch.randint(0, 256, (n, c_in, h, w), dtype=torch.uint8, generator=g)
        self.x = (xu if x_dtype == torch.uint8 else (xu.to(torch.int16) - 128).to(torch.int8)).contiguous(
            memory_format=torch.channels_last)
        self.we = torch.randint(-127, 128, (cm, c_in, 1, 1), dtype=torch.int8, generator=g)
        self.wd = torch.randint(-127, 128, (cm, 1, k, k), dtype=torch.int8, generator=g)
        self.wp = torch.randint(-127, 128, (c_out, cm, 1, 1), dtype=torch.int8, generator=g)

        def scales(c):
            return torch.rand(c, generator=g) * 4e-3 + 1e-3

        self.se, self.sd, self.sp = scales(cm), scales(cm), scales(c_out)
        self.be, self.bd, self.bp = torch.randn(cm, generator=g), torch.randn(cm, generator=g), torch.randn(
            c_out, generator=g)
        self.k, self.stride, self.cm = k, stride, cm
        self.xq = (0.05, _qparams(x_dtype, 3, -2))
        # output scales near the values' spread, so that few values saturate
        self.eq = (0.08 * (c_in / 16) ** 0.5 * 4, _qparams(mid_dtype, 2, -100))
        self.dq = (0.07 * 6, _qparams(mid_dtype, 5, -90))
        self.oq = (0.3 * (cm / 96) ** 0.5, _qparams(out_dtype, 128, 0))
        self.mid_dtype, self.out_dtype = mid_dtype, out_dtype
        self.accum = self.x if residual else None
        self.pe = _pack(self.we) if self.expand else None
        self.pd = _pack(self.wd, stride, k // 2, cm)
        self.pp = _pack(self.wp)

    def fused(self, x=None, **overrides):
        x = self.x if x is None else x
        a = dict(x=x, x_scale=self.xq[0], x_zero_point=self.xq[1],
                 expand_w=self.pe, expand_scales=self.se if self.expand else None,
                 expand_bias=self.be if self.expand else None, expand_scale=self.eq[0],
                 expand_zero_point=self.eq[1], expand_dtype=self.mid_dtype, expand_post_op="relu",
                 dw_w=self.pd, dw_scales=self.sd, dw_bias=self.bd, stride=[self.stride] * 2,
                 padding=[self.k // 2] * 2, dilation=[1, 1], dw_scale=self.dq[0], dw_zero_point=self.dq[1],
                 dw_dtype=self.mid_dtype, dw_post_op="relu", project_w=self.pp, project_scales=self.sp,
                 project_bias=self.bp, output_scale=self.oq[0], output_zero_point=self.oq[1],
                 output_dtype=self.out_dtype, post_op="none", accum=self.accum,
                 accum_scale=self.xq[0], accum_zero_point=self.xq[1])
        a.update(overrides)
        return ops.native_inverted_residual(**a)

    def separate(self):
        e, (es, ez) = self.x, self.xq
        if self.expand:
            e = ops.native_conv2d(self.x, *self.xq, self.pe, self.se, self.be, [1, 1], [0, 0], [1, 1], 1, *self.eq,
                                  self.mid_dtype, "relu")
            es, ez = self.eq
        d = ops.native_conv2d(e, es, ez, self.pd, self.sd, self.bd, [self.stride] * 2, [self.k // 2] * 2, [1, 1],
                              self.cm, *self.dq, self.mid_dtype, "relu")
        return ops.native_conv2d(d, *self.dq, self.pp, self.sp, self.bp, [1, 1], [0, 0], [1, 1], 1, *self.oq,
                                 self.out_dtype, "none", self.accum, *self.xq)

    def fp64(self):
        """The chain in fp64, each intermediate value quantized by the reference."""
        e, (es, ez) = self.x, self.xq
        if self.expand:
            e64 = R.conv2d_fp64(self.x, *self.xq, self.we, self.se, self.be, (1, 1), (0, 0), (1, 1), 1,
                                post_op="relu")
            e, (es, ez) = R.quantize(e64, *self.eq, self.mid_dtype), self.eq
        d64 = R.conv2d_fp64(e, es, ez, self.wd, self.sd, self.bd, (self.stride,) * 2, (self.k // 2,) * 2, (1, 1),
                            self.cm, post_op="relu")
        d = R.quantize(d64, *self.dq, self.mid_dtype)
        if self.accum is None:
            return R.conv2d_fp64(d, *self.dq, self.wp, self.sp, self.bp, (1, 1), (0, 0), (1, 1), 1)
        return R.conv2d_fp64(d, *self.dq, self.wp, self.sp, self.bp, (1, 1), (0, 0), (1, 1), 1, self.accum,
                             *self.xq)


# (n, c_in, (h, w), expansion, c_out, kernel, stride, residual): MobileNetV2's block kinds, odd sizes
# and channel counts (partial 16- and 64-channel blocks), a 1x1 image, a tall thin one, more images
# than threads and fewer.
GEOMETRIES = [
    (1, 16, (56, 56), 6, 24, 3, 2, False),
    (2, 24, (28, 28), 6, 24, 3, 1, True),
    (1, 32, (30, 30), 1, 16, 3, 1, False),
    (3, 64, (14, 14), 6, 96, 3, 1, False),
    (1, 160, (7, 7), 6, 160, 3, 1, True),
    (5, 96, (14, 14), 6, 160, 3, 2, False),
    (1, 8, (9, 11), 3, 8, 5, 1, True),
    (2, 20, (13, 10), 5, 20, 3, 1, True),
    (1, 4, (1, 1), 2, 4, 3, 1, True),
    (4, 7, (5, 6), 3, 9, 3, 2, False),
    (1, 24, (97, 5), 6, 24, 3, 1, True),
    (9, 24, (16, 16), 6, 24, 3, 1, True),
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[:2])) + f"_{g[2][0]}x{g[2][1]}"
                         + f"_t{g[3]}_o{g[4]}_k{g[5]}_s{g[6]}" + ("_res" if g[7] else ""))
@pytest.mark.parametrize("threads", [1, 2])
def test_equals_the_three_convs(geometry, threads):
    b = Block(*geometry, seed=sum(geometry[:2]))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, ref = b.fused(), b.separate()
    finally:
        torch.set_num_threads(before)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, ref)
    # not a degenerate case: the output spans many levels
    assert y.unique().numel() > min(16, y.numel() // 4)


@pytest.mark.parametrize("x_dtype,mid_dtype,out_dtype", [
    (torch.int8, torch.int8, torch.int8), (torch.uint8, torch.int8, torch.uint8), (torch.int8, torch.uint8,
                                                                                   torch.float32)])
def test_dtypes_at_every_stage(x_dtype, mid_dtype, out_dtype):
    with all_threads():
        for residual in (False, True):
            b = Block(2, 24, (20, 20), 6, 24, residual=residual, x_dtype=x_dtype, mid_dtype=mid_dtype,
                      out_dtype=out_dtype, seed=3)
            assert torch.equal(b.fused(), b.separate())


@pytest.mark.parametrize("geometry", [(2, 24, (20, 20), 6, 24, 3, 1, True), (1, 16, (23, 23), 6, 32, 3, 2, False),
                                      (1, 32, (12, 12), 1, 16, 3, 1, False)])
def test_within_one_lsb_of_the_fp64_chain(geometry):
    """Against the fp64 chain (each intermediate value quantized by the reference): at most 1 LSB,
    on under 1% of the outputs (a tie rounded differently upstream)."""
    b = Block(*geometry, seed=11)
    with all_threads():
        y = b.fused()
    ref = R.quantize(b.fp64(), *b.oq, b.out_dtype)
    diff = (y.int() - ref.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01


def test_nchw_input_and_batch_zero():
    b = Block(2, 24, (10, 10), 6, 24, residual=True, seed=5)
    ref = b.separate()
    assert torch.equal(b.fused(b.x.contiguous(), accum=b.x.contiguous()), ref)
    empty = b.x[:0]
    y = b.fused(empty, accum=empty)
    assert y.shape == (0, 24, 10, 10)


def test_opcheck():
    b = Block(2, 8, (6, 6), 3, 8, residual=True, seed=2)
    args = (b.x, *b.xq, b.pe, b.se, b.be, *b.eq, torch.uint8, "relu", b.pd, b.sd, b.bd, [1, 1], [1, 1], [1, 1],
            *b.dq, torch.uint8, "relu", b.pp, b.sp, b.bp, *b.oq, torch.uint8, "none", b.accum, *b.xq)
    torch.library.opcheck(ops.native_inverted_residual.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))


def test_bad_arguments_name_themselves():
    b = Block(1, 8, (6, 6), 3, 8, residual=True, seed=4)
    with pytest.raises(ValueError, match="expand_w takes 8 input channels"):
        b.fused(b.x[:, :4].contiguous(memory_format=torch.channels_last), accum=None)
    with pytest.raises(ValueError, match="dw_w is a depthwise weight for 24 channels"):
        b.fused(expand_w=_pack(torch.ones(16, 8, 1, 1, dtype=torch.int8)), expand_scales=torch.ones(16),
                expand_bias=None)
    with pytest.raises(ValueError, match="project_w must be a 1x1"):
        b.fused(project_w=_pack(torch.ones(8, 24, 3, 3, dtype=torch.int8), padding=1))
    with pytest.raises(ValueError, match="dw_w is not a native packed depthwise weight"):
        b.fused(dw_w=b.pp)
    with pytest.raises(TypeError, match="dw_dtype must be uint8 or int8"):
        b.fused(dw_dtype=torch.float32)
    with pytest.raises(ValueError, match="expand_scales"):
        b.fused(expand_scales=torch.ones(5))
    with pytest.raises(ValueError, match="expand_w needs expand_scales"):
        b.fused(expand_scales=None)
    with pytest.raises(ValueError, match="accum must have the output's shape"):
        b.fused(accum=b.x[:, :, :3])
    with pytest.raises(ValueError, match="project_bias"):
        b.fused(project_bias=torch.ones(3))
    with pytest.raises(ValueError, match="x_scale"):
        b.fused(x_scale=-1.0)
    with pytest.raises(TypeError, match="x must have dtype uint8 or int8"):
        b.fused(b.x.float(), accum=None)
