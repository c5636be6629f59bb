"""The conv2d geometry contracts checked in Python, where a PackedConv2dWeight is built and where
it is called (one place for every provider; the kernels' own checks in csrc/common/conv_params.h
stay behind them):

* groups: a positive int dividing the weight's output channels; an input's channels must be
  weight.shape[1] * groups (the message names groups, in_channels and the weight's shape, and
  the groups that would fit);
* padding: the padded input of one image, in_channels x (H + 2 ph) x (W + 2 pw) computed in
  Python ints, must hold at most MAX_PADDED_IMAGE_VALUES values. Every provider materialises a
  padded (or im2col) copy of the input, so a padding of thousands asks the allocator for tens
  of GB; it is refused with a ValueError naming padding instead. At build time the input is the
  example's shape (x_shape) or, without one, 1 x 1 (the padding alone is too large).
"""
from __future__ import annotations

from typing import Sequence

import torch

# 2^31 - 1 values: 2 GiB of uint8 per image, past any padded input a CNN layer has (a 4096 x 4096
# image of 64 channels, padded by 1, holds 1.07e9) and within 32-bit indexing.
MAX_PADDED_IMAGE_VALUES = (1 << 31) - 1


def _groups_hint(channels: int, per_group: int) -> str:
    if per_group and channels % per_group == 0:
        return f"; groups={channels // per_group} would take {channels}"
    return ""


def check_weight_groups(weight_shape: Sequence[int], groups) -> int:
    """groups as an int, checked against a weight [OC, IC/groups, KH, KW]."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    oc, icg = int(weight_shape[0]), int(weight_shape[1])
    if oc % groups:
        raise ValueError(f"groups={groups} does not divide the weight's {oc} output channels (weight shape "
                         f"{list(weight_shape)}: [out_channels, in_channels/groups, kH, kW])")
    return groups


def check_padding(in_channels: int, h: int, w: int, padding: Sequence[int], where: str) -> None:
    """Refuse a padding whose padded input (one image of `in_channels` x h x w) is past the limit."""
    ph, pw = h + 2 * int(padding[0]), w + 2 * int(padding[1])
    values = int(in_channels) * ph * pw
    if values > MAX_PADDED_IMAGE_VALUES:
        raise ValueError(f"padding={list(padding)} pads {where} ({in_channels} channels of {h}x{w}) to {ph}x{pw}: "
                         f"{values:.3g} values per image, past the limit of {MAX_PADDED_IMAGE_VALUES} "
                         "(2^31 - 1); a padding this large only adds outputs that read zeros")


def check_geometry(weight_shape: Sequence[int], groups, padding: Sequence[int], x_shape=None) -> int:
    """Build-time checks of a conv weight's geometry; returns groups as an int."""
    groups = check_weight_groups(weight_shape, groups)
    in_channels = int(weight_shape[1]) * groups
    if x_shape is not None and len(x_shape) == 4:
        check_padding(in_channels, int(x_shape[2]), int(x_shape[3]), padding, "x_shape")
    else:
        check_padding(in_channels, 1, 1, padding, "even a 1x1 input")
    return groups


def check_input(x, weight_shape: Sequence[int], groups: int, padding: Sequence[int]) -> None:
    """Call-time checks of x [N, C, H, W] against the weight (symbolic sizes are left to the
    kernels' checks: they would become guards under torch.compile). A few int operations: it
    runs on every call."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return  # the kernels name the type and rank
    _, c, h, w = x.shape
    per_group = weight_shape[1]
    if not isinstance(c, int):
        return
    if c != per_group * groups:
        raise ValueError(f"x has {c} channels, but the weight of shape {list(weight_shape)} with groups={groups} takes "
                         f"in_channels = weight.shape[1] * groups = {per_group} * {groups} = {per_group * groups}"
                         + _groups_hint(c, per_group))
    ph, pw = padding
    if (ph or pw) and isinstance(h, int) and isinstance(w, int) \
            and c * (h + 2 * ph) * (w + 2 * pw) > MAX_PADDED_IMAGE_VALUES:
        check_padding(c, h, w, padding, "x")
