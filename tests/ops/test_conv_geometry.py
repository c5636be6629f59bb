"""Conv2d geometry contracts checked where a PackedConv2dWeight is built and called, for every
provider (qbackend/ops/conv_geometry.py): a groups that does not fit the input is an error naming
groups, in_channels and the weight's shape; a padding whose padded input is past 2^31 - 1 values
per image is a ValueError naming padding, not a request for tens of GB; sane paddings (larger than
the kernel included) stay exact against the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from qbackend.core.extension import _C
from qbackend.ops import PackedConv2dWeight
from qbackend.ops import reference as R
from qbackend.ops.conv_geometry import MAX_PADDED_IMAGE_VALUES

PROVIDERS = ["fbgemm", "onednn", "native"]


def _skip_unavailable(provider):
    if provider == "native" and not _C.native_isa():
        pytest.skip("no native GEMM on this ISA")


def _weight(shape, seed=0):
    return torch.randint(-100, 101, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def _x(shape, seed=1):
    # 7-bit values: exact on every provider and ISA
    return torch.randint(0, 128, shape, dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed)).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_wrong_groups_names_groups_in_channels_and_weight_shape(provider):
    _skip_unavailable(provider)
    if provider == "native":  # groups 1 or depthwise only
        shape, groups, channels = (32, 1, 3, 3), 32, 16
        expected = r"x has 16 channels, but the weight of shape \[32, 1, 3, 3\] with groups=32 takes in_channels = " \
                   r"weight.shape\[1\] \* groups = 1 \* 32 = 32; groups=16 would take 16"
    else:
        shape, groups, channels = (32, 16, 3, 3), 2, 16
        expected = r"x has 16 channels, but the weight of shape \[32, 16, 3, 3\] with groups=2 takes in_channels = " \
                   r"weight.shape\[1\] \* groups = 16 \* 2 = 32; groups=1 would take 16"
    pw = PackedConv2dWeight(_weight(shape), torch.full((32,), 1e-2), None, 1, 1, 1, groups, provider)
    with pytest.raises(ValueError, match=expected):
        pw.conv2d(_x((2, channels, 8, 8)), 0.05, 3)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_groups_not_dividing_out_channels_names_the_weight(provider):
    _skip_unavailable(provider)
    with pytest.raises(ValueError, match=r"groups=3 does not divide the weight's 32 output channels .*\[32, 16, 3, 3\]"):
        PackedConv2dWeight(_weight((32, 16, 3, 3)), torch.full((32,), 1e-2), None, 1, 1, 1, 3, provider)
    for bad in (1.5, True, "2"):
        with pytest.raises(ValueError, match="groups must be an int"):
            PackedConv2dWeight(_weight((32, 16, 3, 3)), torch.full((32,), 1e-2), None, 1, 1, 1, bad, provider)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_huge_padding_is_refused_when_packed(provider):
    _skip_unavailable(provider)
    w = _weight((32, 16, 3, 3))
    # 16 channels x 60001 x 60001 (1.15e11 values: the 115 GB a provider's padded copy would take)
    with pytest.raises(ValueError, match=r"padding=\[30000, 30000\] pads even a 1x1 input \(16 channels of 1x1\) to "
                                         r"60001x60001: 5.76e\+10 values per image, past the limit"):
        PackedConv2dWeight(w, torch.full((32,), 1e-2), None, 1, 30000, 1, 1, provider)
    with pytest.raises(ValueError, match=r"padding=\[30000, 20000\] pads x_shape \(16 channels of 8x8\) to "
                                         r"60008x40008"):
        PackedConv2dWeight(w, torch.full((32,), 1e-2), None, 1, (30000, 20000), 1, 1, provider,
                           x_shape=[1, 16, 8, 8])
    # one side only grows the padded input linearly: 16 x 8 x 60008 values are fine to pack
    PackedConv2dWeight(w, torch.full((32,), 1e-2), None, 1, (0, 30000), 1, 1, provider, x_shape=[1, 16, 8, 8])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_padding_too_large_for_the_input_is_refused_when_called(provider):
    _skip_unavailable(provider)
    # packed without an input shape: 256 x 2801 x 2801 = 2.008e9 values fits; a 100x100 input does not
    assert 256 * 2801 * 2801 <= MAX_PADDED_IMAGE_VALUES < 256 * 2900 * 2900
    pw = PackedConv2dWeight(_weight((4, 256, 1, 1)), torch.full((4,), 1e-2), None, 1, 1400, 1, 1, provider)
    with pytest.raises(ValueError, match=r"padding=\[1400, 1400\] pads x \(256 channels of 100x100\) to 2900x2900"):
        pw.conv2d(_x((1, 256, 100, 100)), 0.05, 3)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("padding,dilation", [((4, 4), (1, 1)), ((0, 7), (2, 1)), ((2, 1), (3, 3))])
def test_sane_paddings_stay_exact(provider, padding, dilation):
    _skip_unavailable(provider)
    w, ws, b = _weight((8, 6, 3, 3)), torch.rand(8, generator=torch.Generator().manual_seed(3)) * 1e-2 + 1e-3, None
    pw = PackedConv2dWeight(w, ws, b, 1, padding, dilation, 1, provider)
    x = _x((2, 6, 7, 9))
    y = pw.conv2d(x, 0.05, 3, 1.0, 0, torch.float32)
    ref = R.conv2d_fp64(x, 0.05, 3, w, ws, b, (1, 1), padding, dilation, 1)
    assert y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
