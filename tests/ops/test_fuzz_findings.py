"""Op instances the differential fuzzers (tests/fuzz) found wrong or unclear, each now routed to an
exact provider or answered with a clear error, by the geometry that showed it:

* oneDNN convs with padding past "same" padding: a 1x1 conv with padding (0, 2) and stride (1, 3)
  on a 1-wide input with zero point 0 segfaulted (every output column sees only padding); a
  depthwise 3x3 with padding 3 and a dense 5x5 with padding (3, 2) were wrong with a nonzero zero
  point. The onednn provider writes such padding out and runs unpadded: exact, on every ISA. Where
  oneDNN saturates 8-bit products (QBACKEND_ISA=avx2), a padded conv with a zero point above 127
  (a 1x1 with padding and zero point 255 was 27% off) is a ValueError naming x_zero_point.
* oneDNN convs with one output column (row) and a stride >= 2 across it: single-channel and
  depthwise ones on AMD EPYC (1 channel, 9x6 input, kernel 5x5, stride (1, 3), float32 output: 1e4x
  the fp32 tolerance), dense and grouped ones too on the AMX Xeon (3 -> 2 channels, 5x5 input, kernel
  5x5, stride (1, 2), padding (2, 0): 19 LSB off):
  the onednn provider widens the input by one stride (a second output column) and keeps the first:
  exact at every input size, whatever size the layer was routed at.
* The reference provider checks its arguments like the others, and runs linear_dynamic on 0 rows.
* A one-row rowwise embedding table with an odd dim (its row stride odd) reads its scale and bias.
* linear_dynamic(reduce_range=False) where the provider saturates 8-bit products raises also on an
  empty batch; max_pool2d names kernel_size where the output would be empty and refuses an input
  with 0 channels (aten's rule), in eager mode.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.core.extension import _C
from qbackend.ops import PROVIDERS, PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import reference as R
from qbackend.ops.embedding import PackedEmbeddingTable, dequantize_rowwise, quantize_rowwise

ops = torch.ops.qbackend

# (name, c_in, c_out, groups, kernel, h, w, stride, padding, dilation, x_zp)
OVER_PADDED = [
    ("1x1 pad (0,2) stride (1,3) on width 1 (segfaulted)", 5, 13, 1, (1, 1), 6, 1, (1, 3), (0, 2), (1, 3), 0),
    ("1x1 pad (1,1) stride (1,3) on 2x2 (segfaulted)", 34, 30, 1, (1, 1), 2, 2, (1, 3), (1, 1), (1, 3), 0),
    ("1x1 pad (4,3) stride 2 on 6x1 (segfaulted)", 11, 33, 1, (1, 1), 6, 1, (2, 2), (4, 3), (1, 3), 0),
    ("depthwise 3x3 pad 3", 12, 12, 12, (3, 3), 8, 7, (1, 1), (3, 3), (1, 1), 100),
    ("depthwise x3 3x3 pad (3,0)", 12, 36, 12, (3, 3), 8, 7, (1, 1), (3, 0), (1, 1), 255),
    ("dense 5x5 pad (3,2)", 8, 8, 1, (5, 5), 9, 9, (1, 1), (3, 2), (1, 1), 100),
    ("dense 3x3 dilation (2,3) pad (4,3) stride (1,2)", 17, 39, 1, (3, 3), 7, 6, (1, 2), (4, 3), (2, 3), 207),
    ("1x1 pad 1 zp 255", 8, 16, 1, (1, 1), 6, 6, (1, 1), (1, 1), (1, 1), 255),
]


@pytest.mark.parametrize("name,c_in,c_out,groups,kernel,h,w,stride,padding,dilation,x_zp", OVER_PADDED,
                         ids=[c[0] for c in OVER_PADDED])
def test_onednn_conv_padded_past_same_is_exact(name, c_in, c_out, groups, kernel, h, w, stride, padding, dilation,
                                               x_zp):
    g = torch.Generator().manual_seed(7)
    wq = torch.randint(-127, 128, (c_out, c_in // groups, *kernel), dtype=torch.int8, generator=g)
    ws = torch.full((c_out,), 1e-2)
    pw = PackedConv2dWeight(wq, ws, None, stride, padding, dilation, groups, "onednn")
    exact = PROVIDERS["onednn"].exact_8bit()
    x = torch.randint(0, 256 if exact else 128, (2, c_in, h, w), dtype=torch.uint8, generator=g)
    for layout in (torch.channels_last, torch.contiguous_format):
        xl = x.contiguous(memory_format=layout)
        for zp in sorted({0, x_zp, 127}):
            if not exact and zp > 127:
                with pytest.raises(ValueError, match="x_zero_point"):
                    pw.conv2d(xl, 0.05, zp, 1.0, 0, torch.float32)
                continue
            y = pw.conv2d(xl, 0.05, zp, 1.0, 0, torch.float32)
            ref = R.conv2d_fp64(xl, 0.05, zp, wq, ws, None, stride, padding, dilation, groups)
            torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
            yq = pw.conv2d(xl, 0.05, zp, 0.5, 3, torch.uint8)
            assert (yq.int() - R.quantize(ref, 0.5, 3, torch.uint8).int()).abs().max() <= 1


# (in channels, out channels, groups, kernel, h, w, stride): depthwise and one-channel ones first
# seen wrong on AMD EPYC; dense and grouped ones on the AMX Xeon (the property test, 2026-12-05).
ONE_COLUMN = [(1, 1, 1, (5, 5), 9, 6, (1, 3)), (1, 1, 1, (5, 5), 9, 5, (1, 2)), (1, 1, 1, (5, 5), 6, 9, (3, 1)),
              (4, 4, 4, (3, 3), 8, 3, (1, 2)), (3, 2, 1, (5, 5), 9, 5, (1, 2)), (16, 32, 1, (3, 3), 9, 5, (1, 3)),
              (4, 4, 2, (5, 5), 7, 6, (1, 2)), (3, 2, 1, (5, 5), 5, 9, (2, 1))]


@pytest.mark.parametrize("c,c_out,groups,kernel,h,w,stride", ONE_COLUMN)
def test_onednn_one_strided_output_column_is_exact(c, c_out, groups, kernel, h, w, stride):
    g = torch.Generator().manual_seed(41)
    wq = torch.randint(-127, 128, (c_out, c // groups, *kernel), dtype=torch.int8, generator=g)
    ws = torch.full((c_out,), 1e-3)
    b = torch.randn(c_out, generator=g)
    # packed for a larger input (routed there), called on the one-column size
    pw = PackedConv2dWeight(wq, ws, b, stride, (0, 0), (1, 1), groups, "onednn", x_shape=[2, c, 2 * h, 2 * w])
    x = torch.randint(0, 128, (2, c, h, w), dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    acc = torch.randint(0, 256, (2, c_out) + tuple((s - k) // st + 1 for s, k, st in zip((h, w), kernel, stride)),
                        dtype=torch.uint8, generator=g).contiguous(memory_format=torch.channels_last)
    assert 1 in acc.shape[2:]
    ref = R.conv2d_fp64(x, 0.02, 5, wq, ws, b, stride, (0, 0), (1, 1), groups)
    torch.testing.assert_close(pw.conv2d(x, 0.02, 5, 1.0, 0, torch.float32).double(), ref, rtol=1e-5, atol=1e-5)
    relu = pw.conv2d(x, 0.02, 5, 0.05, 3, torch.uint8, "relu")
    assert (relu.int() - R.quantize(ref.clamp_min(0), 0.05, 3, torch.uint8).int()).abs().max() <= 1
    with_acc = ref + (acc.double() - 7) * 0.04
    y = pw.conv2d(x, 0.02, 5, 0.05, 3, torch.uint8, "relu", acc, 0.04, 7)
    assert (y.int() - R.quantize(with_acc.clamp_min(0), 0.05, 3, torch.uint8).int()).abs().max() <= 1
    donated = acc.clone()
    pw.conv2d_add_(x, 0.02, 5, 0.05, 3, torch.uint8, "relu", donated, 0.04, 7)
    assert torch.equal(donated, y)


def test_over_padded_conv_through_the_public_api_is_accurate():
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=3), nn.ReLU(), nn.Conv2d(8, 8, 1, padding=1)).eval()
    x = torch.randn(2, 4, 6, 6) + 1.0
    for provider in (None, "onednn"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = qbackend.quantize(model, (x,), [(x,)], config=qbackend.QuantConfig(provider=provider))
        with torch.no_grad():
            ref, y = model(x), q(x)
        assert 10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum()) > 25, provider


def test_reference_provider_checks_its_arguments():
    w = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    pw = PackedLinearWeight(w, torch.full((4,), 0.01), None, "reference")
    x = torch.randint(0, 256, (3, 8), dtype=torch.uint8)
    with pytest.raises(ValueError, match="x_zero_point"):
        pw.linear(x, 0.1, 256)
    with pytest.raises(ValueError, match="x_scale"):
        pw.linear(x, 0.0, 0)
    with pytest.raises(ValueError, match="output_scale"):
        pw.linear(x, 0.1, 0, float("nan"), 0, torch.uint8)
    with pytest.raises(TypeError, match="x must have dtype"):
        pw.linear(x.float(), 0.1, 0)
    with pytest.raises(ValueError, match="in_features"):
        pw.linear(x[:, :7], 0.1, 0)
    wc = torch.randint(-127, 128, (4, 2, 3, 3), dtype=torch.int8)
    pc = PackedConv2dWeight(wc, torch.full((4,), 0.01), None, (1, 1), (1, 1), (1, 1), 1, "reference")
    with pytest.raises(ValueError, match="in_channels"):
        pc.conv2d(torch.zeros(1, 3, 5, 5, dtype=torch.uint8), 0.1, 0)


def test_reference_linear_dynamic_on_zero_rows():
    w = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    pw = PackedLinearWeight(w, torch.full((4,), 0.01), None, "reference")
    for shape in ((0, 8), (2, 0, 8)):
        y = pw.linear_dynamic(torch.zeros(shape), reduce_range=False)
        assert y.dtype == torch.float32 and tuple(y.shape) == (*shape[:-1], 4)


@pytest.mark.parametrize("dim,bits", [(1, 8), (5, 8), (7, 8), (6, 4)])
def test_one_row_embedding_table_with_odd_row_length(dim, bits):
    weight = torch.linspace(-1, 2, dim).reshape(1, dim)
    table = quantize_rowwise(weight, bits)
    values = dequantize_rowwise(table, dim, bits)
    assert (values - weight).abs().max() <= 3 / ((1 << bits) - 1) / 2 + 1e-3
    t = PackedEmbeddingTable(table, dim, bits)
    assert torch.equal(t.lookup(torch.tensor([0, 0])), values.expand(2, dim))


def test_max_pool2d_errors_name_the_argument():
    x = torch.zeros(1, 4, 3, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="kernel_size"):
        ops.max_pool2d(x, [5, 5], [1, 1], [0, 0], [1, 1], False)
    with pytest.raises(ValueError, match="channel"):
        ops.max_pool2d(torch.zeros(1, 0, 4, 4, dtype=torch.uint8), [2, 2], [2, 2], [0, 0], [1, 1], False)
    assert ops.max_pool2d(torch.zeros(0, 4, 4, 4, dtype=torch.uint8), [2, 2], [2, 2], [0, 0], [1, 1],
                          False).shape == (0, 4, 2, 2)


_EMPTY_BATCH = """
import torch, qbackend
from qbackend.ops import PackedLinearWeight
w = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
for p in ("fbgemm", "onednn"):
    pw = PackedLinearWeight(w, torch.full((4,), 0.01), None, p)
    for shape in ((0, 8), (3, 8)):
        try:
            pw.linear_dynamic(torch.zeros(shape), reduce_range=False)
            print(p, shape, "returned")
        except ValueError as e:
            print(p, shape, "ValueError" if "reduce_range" in str(e) else e)
"""


def test_linear_dynamic_full_range_refused_on_an_empty_batch_where_it_saturates():
    env = dict(os.environ, QBACKEND_ISA="avx2")
    out = subprocess.run([sys.executable, "-c", _EMPTY_BATCH], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines == [f"{p} {s} ValueError" for p in ("fbgemm", "onednn") for s in ((0, 8), (3, 8))], lines


@pytest.mark.skipif(not _C.native_isa(), reason="the in-process check of an exact CPU needs VNNI")
def test_linear_dynamic_full_range_on_an_empty_batch_where_exact():
    w = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    for p in ("fbgemm", "onednn", "native"):
        pw = PackedLinearWeight(w, torch.full((4,), 0.01), None, p)
        if PROVIDERS[p].exact_8bit():
            assert pw.linear_dynamic(torch.zeros(0, 8), reduce_range=False).shape == (0, 4)
