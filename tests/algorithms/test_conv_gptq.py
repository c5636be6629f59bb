"""GPTQ rounding and bias correction for convs (qbackend/algorithms/gptq.py): the conv input
recorder against im2col products in fp64 (all groups, strides, dilations, padding; NaN images
skipped; the output-position sub-grid taken when a batch is large), the rounding against the output
error it is meant to lower (F.conv2d of the calibration images in fp64 with the float and the
rounded weight, not through H) for plain, grouped and depthwise convs, bias correction against the
mean output shift it is meant to cancel, and the whole path on a small CNN."""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import torch.nn.functional as F
from torch import nn

import qbackend
from qbackend.algorithms import gptq
from qbackend.algorithms.gptq import HessianStats, conv_rows, conv_takes_gptq, corrected_bias, round_weight
from qbackend.nn.weights import quantize_weight

from ..lowering.toy_models import ResidualCNN, init_bn, sqnr


def _conv(kernel=3, stride=1, padding=1, dilation=1, groups=1) -> dict:
    pair = lambda v: (v, v)  # noqa: E731
    return {"kernel": pair(kernel), "stride": pair(stride), "padding": pair(padding), "dilation": pair(dilation),
            "groups": groups}


def _im2col(x: torch.Tensor, conv: dict, step: int = 1) -> torch.Tensor:
    stride = (conv["stride"][0] * step, conv["stride"][1] * step)
    cols = F.unfold(x.double(), conv["kernel"], dilation=conv["dilation"], padding=conv["padding"], stride=stride)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def smooth_images(n: int, c: int, size: int, g: torch.Generator) -> torch.Tensor:
    """Spatially correlated images (neighbouring pixels alike), as activations of a real CNN are:
    where the columns of a conv's receptive field are correlated and error compensation pays."""
    coarse = torch.randn(n, c, size // 4 + 1, size // 4 + 1, generator=g)
    x = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    return x + 0.05 * torch.randn(n, c, size, size, generator=g) + 0.3


@pytest.mark.parametrize("conv", [_conv(), _conv(3, 2, 1), _conv(1, 1, 0), _conv(3, 1, 2, 2), _conv(3, 1, 1, 1, 4),
                                  _conv(5, 2, 2, 1, 8)])
def test_conv_recorder_is_im2col_xtx_and_column_means(conv):
    g = torch.Generator().manual_seed(conv["kernel"][0] * 7 + conv["groups"])
    rec = HessianStats("x", conv)
    batches = [torch.randn(2, 8, 11, 9, generator=g) for _ in range(3)]
    batches[1][1, 3, 4, 4] = float("nan")  # a pixel every conv here reads: image 1 of batch 1 is skipped
    for b in batches:
        rec(b)
    kept = [batches[0], batches[1][:1], batches[2]]
    rows = torch.cat([_im2col(b, conv) for b in kept])
    assert rec.rows == rows.shape[0] == sum(conv_rows(b.shape, conv) for b in kept)
    torch.testing.assert_close(rec.mean(), rows.mean(0), rtol=1e-6, atol=1e-6)
    groups = conv["groups"]
    k = rows.shape[1] // groups
    want = torch.stack([rows[:, i * k:(i + 1) * k].t() @ rows[:, i * k:(i + 1) * k] for i in range(groups)])
    got = rec.hessian.double() if groups > 1 else rec.hessian.double()[None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


def test_conv_recorder_takes_a_subgrid_of_positions_on_large_batches(monkeypatch):
    monkeypatch.setattr(gptq, "MIN_SAMPLED_ROWS", 16)
    conv = _conv()
    x = torch.randn(2, 4, 20, 20, generator=torch.Generator().manual_seed(1))
    rec = HessianStats("x", conv)
    rec(x)
    # 800 rows > max(2 x 36, 16): every 4th position each way leaves 2 x 5 x 5 = 50 <= 72
    rows = _im2col(x, conv, step=4)
    assert rows.shape[0] == 50
    torch.testing.assert_close(rec.hessian.double(), rows.t() @ rows, rtol=1e-5, atol=1e-4)
    # the mean is over every position, not the sample
    torch.testing.assert_close(rec.mean(), _im2col(x, conv).mean(0), rtol=1e-6, atol=1e-6)
    assert rec.rows == 800


def _output_error(x, w, q, scales, conv) -> float:
    """|conv(x, W) - conv(x, Q s)|^2 in fp64, the error GPTQ lowers."""
    wq = q.double() * scales.double().view(-1, 1, 1, 1)
    args = dict(stride=conv["stride"], padding=conv["padding"], dilation=conv["dilation"], groups=conv["groups"])
    return float((F.conv2d(x.double(), w.double(), **args) - F.conv2d(x.double(), wq, **args)).pow(2).sum())


@pytest.mark.parametrize("cin,cout,groups", [(16, 24, 1), (16, 32, 4), (24, 24, 24)])
def test_conv_gptq_lowers_the_output_error_on_calibration_and_fresh_images(cin, cout, groups, monkeypatch):
    monkeypatch.setattr(gptq, "MIN_SAMPLED_ROWS", 1 << 20)  # H over every position: the proxy is the error below
    g = torch.Generator().manual_seed(cin + cout + groups)
    conv = _conv(groups=groups)
    w = torch.randn(cout, cin // groups, 3, 3, generator=g) * 0.1
    calib, fresh = smooth_images(8, cin, 16, g), smooth_images(8, cin, 16, g)
    rec = HessianStats("x", conv)
    rec(calib)
    q0, scales = quantize_weight(w)
    q, info = round_weight(w, scales, rec.hessian, -128, 127, nearest=q0)
    assert info["method"] == "gptq" and q.dtype == torch.int8 and q.shape == w.shape
    assert int(q.min()) >= -128 and int(q.max()) <= 127
    before, after = _output_error(calib, w, q0, scales, conv), _output_error(calib, w, q, scales, conv)
    assert 10 * math.log10(before / after) > 1.0, (before, after)
    assert info["proxy_error"] == pytest.approx(after, rel=1e-3)
    assert info["proxy_error_nearest"] == pytest.approx(before, rel=1e-3)
    assert _output_error(fresh, w, q, scales, conv) < _output_error(fresh, w, q0, scales, conv)
    if groups == cout:  # depthwise: per channel, never worse than nearest on its own calibration rows
        for c in range(cout):
            one = dict(conv, groups=1)
            e0 = _output_error(calib[:, c:c + 1], w[c:c + 1], q0[c:c + 1], scales[c:c + 1], one)
            e1 = _output_error(calib[:, c:c + 1], w[c:c + 1], q[c:c + 1], scales[c:c + 1], one)
            assert e1 <= e0 * (1 + 1e-9), c


def test_depthwise_channels_without_data_keep_nearest_rounding():
    w = torch.randn(6, 1, 3, 3, generator=torch.Generator().manual_seed(4))
    q0, scales = quantize_weight(w)
    h = torch.zeros(6, 9, 9)
    q, info = round_weight(w, scales, h, -128, 127, nearest=q0)
    assert torch.equal(q, q0) and info["method"] == "nearest"


def test_bias_correction_cancels_a_known_mean_shift():
    """Inputs with a large common mean: nearest rounding shifts each output channel's mean by
    (Q s - W) E[x]; the corrected bias brings the mean output error to zero (fp64), while the
    error around the mean is untouched."""
    g = torch.Generator().manual_seed(6)
    conv = _conv(stride=2)
    x = torch.randn(4, 8, 12, 12, generator=g) * 0.2 + torch.linspace(1.0, 3.0, 8).view(1, 8, 1, 1)
    w = torch.randn(16, 8, 3, 3, generator=g) * 0.1
    b = torch.randn(16, generator=g) * 0.1
    rec = HessianStats("x", conv, second_moment=False)
    rec(x)
    assert rec.hessian is None
    q, scales = quantize_weight(w)
    args = dict(stride=2, padding=1)
    ref = F.conv2d(x.double(), w.double(), b.double(), **args)

    def mean_error(bias):
        out = F.conv2d(x.double(), q.double() * scales.double().view(-1, 1, 1, 1), bias.double(), **args)
        return (out - ref).mean(dim=(0, 2, 3))

    shifted = mean_error(b)
    corrected = mean_error(corrected_bias(w, q, scales, b, rec.mean()))
    assert float(shifted.abs().max()) > 1e-3  # the shift is there to correct
    assert float(corrected.abs().max()) < 1e-6 * max(1.0, float(ref.abs().max()))
    # the known shift: (Q s - W) summed over the mean of each im2col column
    want = (q.double() * scales.double().view(-1, 1, 1, 1) - w.double()).reshape(16, -1) @ rec.mean()
    torch.testing.assert_close(shifted, want, rtol=1e-9, atol=1e-9)


def test_bias_correction_of_a_grouped_conv_and_without_bias():
    g = torch.Generator().manual_seed(8)
    conv = _conv(groups=4)
    x = torch.randn(2, 8, 7, 7, generator=g) + 2.0
    w = torch.randn(12, 2, 3, 3, generator=g) * 0.3
    rec = HessianStats("x", conv, second_moment=False)
    rec(x)
    q, scales = quantize_weight(w)
    b = corrected_bias(w, q, scales, None, rec.mean())
    out = F.conv2d(x.double(), q.double() * scales.double().view(-1, 1, 1, 1), b.double(), padding=1, groups=4)
    ref = F.conv2d(x.double(), w.double(), padding=1, groups=4)
    assert float((out - ref).mean(dim=(0, 2, 3)).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="does not fit"):
        corrected_bias(w, q, scales, None, rec.mean()[:-1])


def test_only_convs_with_enough_output_positions_take_gptq():
    conv = _conv()
    assert conv_takes_gptq((8, 64, 56, 56), conv, 576)       # 25088 rows >= 2 x 576
    assert not conv_takes_gptq((8, 512, 7, 7), conv, 4608)   # 392 rows
    assert conv_rows((2, 3, 9, 9), _conv(3, 2, 1)) == 2 * 5 * 5


def test_cnn_is_closer_to_fp32_with_gptq_and_bias_correction_and_layers_stay_exact():
    from ..lowering.layer_reference import check_layers

    torch.manual_seed(0)
    model = init_bn(ResidualCNN(c=16))
    g = torch.Generator().manual_seed(3)
    data = [(smooth_images(4, 3, 24, g),) for _ in range(6)]
    ref = torch.cat([model(*d) for d in data[4:]])
    out = {}
    for label, cfg in {"nearest": dict(weight_rounding="nearest", bias_correction=False),
                       "default": {}}.items():
        q = qbackend.quantize(model, data[0], data[:4], config=qbackend.QuantConfig(**cfg))
        out[label] = sqnr(ref, torch.cat([q(*d) for d in data[4:]]))
        records = {name: info.weight_rounding for name, info in q.qbackend_layers.items()}
        if label == "default":  # every conv bias corrected; the Linear head only where GPTQ kept nearest
            assert all(r is not None and (r.get("bias_corrected") or r["method"] == "gptq")
                       for r in records.values()), records
            assert all(records[n].get("bias_corrected") for n, info in q.qbackend_layers.items()
                       if info.kind == "conv2d"), records
            assert sum(r["method"] == "gptq" for r in records.values()) >= 4, records
            assert check_layers(q, *data[4]) == len(records)
        else:
            assert all(r is None for r in records.values())
    assert out["default"] > out["nearest"] + 0.5, out


def test_depthwise_channels_with_unusable_hessians_keep_nearest_rounding():
    """A channel whose H is not finite or not positive definite keeps nearest rounding; the others
    are still rounded by GPTQ."""
    g = torch.Generator().manual_seed(9)
    conv = _conv(groups=4)
    w = torch.randn(4, 1, 3, 3, generator=g) * 0.1
    rec = HessianStats("x", conv)
    rec(smooth_images(4, 4, 12, g))
    h = rec.hessian.clone()
    h[1] = float("inf")
    h[2] = -torch.eye(9)
    q0, scales = quantize_weight(w)
    q, info = round_weight(w, scales, h, -128, 127, nearest=q0)
    assert torch.equal(q[1], q0[1]) and torch.equal(q[2], q0[2])
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert math.isfinite(info["proxy_error"]) and math.isfinite(info["proxy_error_nearest"])


@pytest.mark.parametrize("kernel,stride,padding,dilation", [
    ((7, 7), (2, 2), (3, 3), (1, 1)), ((3, 3), (1, 1), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1), (2, 2)),
    ((1, 1), (2, 2), (0, 0), (1, 1)), ((2, 3), (1, 2), (0, 1), (2, 1))])
def test_im2col_column_sums_are_those_of_the_unfolded_rows(kernel, stride, padding, dilation):
    """The per-image column sums bias correction and H's mean use, taken without forming the im2col
    rows, against the fp64 sums of F.unfold's rows."""
    conv = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "groups": 1}
    x = torch.randn(3, 5, 17, 18, generator=torch.Generator().manual_seed(2))
    cols = F.unfold(x.double(), kernel, dilation=dilation, padding=padding, stride=stride)
    got = gptq._im2col_column_sums(x, conv)
    assert got.dtype == torch.float32 and got.shape == cols.shape[:2]
    torch.testing.assert_close(got.double(), cols.sum(2), rtol=0, atol=1e-4)


def test_im2col_column_sums_edge_cases():
    """Taps that only read the padding sum to 0, a channels-last input gives the contiguous one's
    sums, and a NaN reaches exactly the columns whose positions read it."""
    conv = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
    x = torch.randn(2, 3, 1, 1, generator=torch.Generator().manual_seed(3))
    got = gptq._im2col_column_sums(x, conv).reshape(2, 3, 3, 3)
    assert torch.equal(got[:, :, 1, 1], x[:, :, 0, 0]) and int((got != 0).sum()) == 6
    x = torch.randn(2, 70, 9, 7, generator=torch.Generator().manual_seed(4))  # two channel blocks
    want = gptq._im2col_column_sums(x, conv)
    assert torch.equal(gptq._im2col_column_sums(x.to(memory_format=torch.channels_last), conv), want)
    x = x[:, :4].contiguous()
    x[1, 2, 0, 0] = float("nan")
    got = gptq._im2col_column_sums(x, conv).reshape(2, 4, 3, 3)
    nan = torch.zeros(2, 4, 3, 3, dtype=torch.bool)
    nan[1, 2, :2, :2] = True  # kernel rows and columns 0 and 1 reach input (0, 0) (padding 1)
    assert torch.equal(got.isnan(), nan)
    for stride in ((1, 1), (3, 3)):  # a kernel larger than the input: no output position, zero sums
        empty = {"kernel": (5, 5), "stride": stride, "padding": (0, 0), "dilation": (1, 1), "groups": 1}
        assert torch.equal(gptq._im2col_column_sums(torch.ones(1, 2, 3, 3), empty), torch.zeros(1, 50))


def test_im2col_column_sums_names_bad_arguments():
    op = torch.ops.qbackend.im2col_column_sums
    with pytest.raises(ValueError, match="x must be 4-D"):
        op(torch.zeros(2, 3, 4), [1, 1], [1, 1], [0, 0], [1, 1])
    with pytest.raises(TypeError, match="x must have dtype torch.float32"):
        op(torch.zeros(1, 1, 4, 4, dtype=torch.float64), [1, 1], [1, 1], [0, 0], [1, 1])
    with pytest.raises(ValueError, match=r"stride values must be in \[1, 65535\]"):
        op(torch.zeros(1, 1, 4, 4), [1, 1], [0, 1], [0, 0], [1, 1])
    with pytest.raises(ValueError, match=r"padding values must be in \[0, 65535\]"):
        op(torch.zeros(1, 1, 4, 4), [1, 1], [1, 1], [-1, 0], [1, 1])


@pytest.mark.parametrize("kernel,stride,padding,dilation,size", [
    ((1, 1), (1, 1), (0, 0), (1, 1), (56, 56)), ((1, 1), (2, 2), (0, 0), (1, 1), (57, 55)),
    ((3, 3), (1, 1), (1, 1), (1, 1), (40, 40)), ((3, 3), (2, 2), (1, 1), (1, 1), (9, 7)),
    ((7, 7), (2, 2), (3, 3), (1, 1), (45, 44)), ((2, 3), (1, 2), (3, 2), (2, 1), (30, 33))])
def test_sampled_rows_are_the_unfolded_rows(kernel, stride, padding, dilation, size):
    """A conv's sampled im2col rows (each tap's strided slice copied into place, zeros for the
    padding) are F.unfold's rows at the sampling step, in the same order, bit for bit."""
    conv = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "groups": 1}
    x = torch.randn(8, 16, *size, generator=torch.Generator().manual_seed(5))
    got = gptq._sampled_im2col(x, conv)
    features = 16 * kernel[0] * kernel[1]
    cap = max(gptq.SAMPLED_ROWS_PER_FEATURE * features, gptq.MIN_SAMPLED_ROWS)
    oh, ow = gptq._output_size(size[0], size[1], conv)
    step = 1
    while 8 * -(-oh // step) * -(-ow // step) > cap and step < max(oh, ow):
        step += 1
    cols = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=(stride[0] * step, stride[1] * step))
    assert torch.equal(got, cols.transpose(1, 2).reshape(-1, features))
    assert size[0] < 40 or step > 1  # the large inputs are sampled
    assert torch.equal(gptq._sampled_im2col(x.contiguous(memory_format=torch.channels_last), conv), got)
    op = torch.ops.qbackend.sampled_im2col
    with FakeTensorMode() as mode:  # the fake impl's shape is the op's
        fake = op(mode.from_tensor(x), list(kernel), list(stride), list(padding), list(dilation), step)
    assert tuple(fake.shape) == tuple(got.shape)


def test_sampled_im2col_rejects_bad_arguments():
    op = torch.ops.qbackend.sampled_im2col
    x = torch.zeros(1, 2, 5, 5)
    with pytest.raises(ValueError, match="step must be >= 1"):
        op(x, [3, 3], [1, 1], [1, 1], [1, 1], 0)
    with pytest.raises(ValueError, match="x must be 4-D"):
        op(x[0], [3, 3], [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(TypeError, match="x must have dtype torch.float32"):
        op(x.double(), [3, 3], [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(ValueError, match=r"kernel values must be in \[1, 65535\]"):
        op(x, [0, 3], [1, 1], [1, 1], [1, 1], 1)
    assert op(x, [7, 7], [1, 1], [0, 0], [1, 1], 1).shape == (0, 2 * 49)  # kernel larger than the input
    assert op(torch.zeros(0, 2, 5, 5), [3, 3], [1, 1], [1, 1], [1, 1], 2).shape == (0, 18)
