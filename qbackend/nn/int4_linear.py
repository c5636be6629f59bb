"""Int4WeightOnlyLinear: 4-bit weights in groups of `group_size` consecutive input features (two
weights a byte, a float16 scale and offset per group: w = scale * u + offset, u in [0, 15], in float32
from the float16 values), float activations; and `quantize_int4`, the group-wise quantizer that makes them.

Asymmetric groups (the default) span each group's [min, max] with 16 levels (offset = min: the form
of GGUF's Q4_1 blocks, whose scale and minimum are float16 too); symmetric ones span [-a, a] (a = the
group's largest magnitude) with the levels -8..7 (u = level + 8, offset = -8 * scale). The grid's
float16 values are chosen so that every weight of the group lies within half a step of a level
(`group_grid`). Float16 group values are a sixth of a group of 32's bytes where float32 ones were a
third: decoding streams the weights, so they are that much less to read. Float32 inputs run qbackend::woq4_linear
(csrc/ops/woq_ops.cpp: the weights stay packed, each dequantized in registers by one FMA), or with
activations="int8" qbackend::woq4a8_linear (W4A8: the input quantized to int8 by blocks of 32
features per call, the products u8 x s8 in int32 by VNNI: about twice as fast at decoding, at the
cost of the activations' rounding); other float dtypes multiply the dequantized weight in their dtype.
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.generation import Tracked
from ..ops import woq as _woq_ops  # noqa: F401  (the woq4 ops and their fakes, resolved below)
from .linear import check_activations
from .weight_tiles import tile_groups, tile_rows, untile_groups, untile_rows

__all__ = ["Int4WeightOnlyLinear", "quantize_int4", "group_grid", "GROUP_SIZES"]

GROUP_SIZES = (16, 32, 64, 128, 256)
_WOQ4 = torch.ops.qbackend.woq4_linear.default
_WOQ4A8 = torch.ops.qbackend.woq4a8_linear.default


def _f16_up(x: torch.Tensor) -> torch.Tensor:
    """The least float16 >= x (float32)."""
    h = x.to(torch.float16)
    return torch.where(h.float() < x, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _f16_down(x: torch.Tensor) -> torch.Tensor:
    """The greatest float16 <= x (float32)."""
    h = x.to(torch.float16)
    return torch.where(h.float() > x, torch.nextafter(h, torch.full_like(h, float("-inf"))), h)


def group_grid(lo: torch.Tensor, hi: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, offset) float16, of lo's shape, of groups whose values lie in [lo, hi] (float32): the
    levels scale * u + offset, u = 0..15, with every value of [lo, hi] within half a step of one.
    Asymmetric: offset = lo and scale = (hi - lo) / 15, each the nearest float16 (so a GGUF Q4_1 block,
    whose values already are float16, keeps its own), unless that leaves an end of [lo, hi] more than
    half a step outside the grid: then lo rounded down and the scale up. Symmetric: scale = 2 a / 15
    rounded up (a = max(|lo|, |hi|)), offset = -8 scale. A group of one value gets scale 1."""
    one = torch.ones_like(lo, dtype=torch.float16)
    if symmetric:
        scale = _f16_up(torch.maximum(lo.abs(), hi.abs()) * 2 / 15)
        scale = torch.where(scale > 0, scale, one)
        offset = -8 * scale
    else:
        offset = lo.to(torch.float16)
        scale = ((hi - offset.float()) / 15).to(torch.float16)
        o, s = offset.float(), scale.float()
        loose = (s <= 0) | (o - lo > s / 2) | (hi - (o + 15 * s) > s / 2)
        if bool(loose.any()):
            down = _f16_down(lo)
            offset = torch.where(loose, down, offset)
            scale = torch.where(loose, _f16_up((hi - down.float()) / 15), scale)
        scale = torch.where(scale > 0, scale, one)  # a group of one float16 value: offset = that value
    if not bool(torch.isfinite(scale).all() and torch.isfinite(offset).all()):
        big = float(torch.maximum(lo.abs(), hi.abs()).max())
        raise ValueError(f"weight values up to {big:g} do not fit float16 group scales and offsets (|scale|, "
                         "|offset| <= 65504)")
    return scale, offset


def quantize_int4(weight: torch.Tensor, group_size: int = 32, symmetric: bool = False):
    """(packed uint8 [N, ceil(K / 2)], scales float16 [N, G], offsets float16 [N, G]) for a float
    weight [N, K], G = ceil(K / group_size) groups per row (the last may be shorter), each weight
    rounded to its nearest level of its group's grid (group_grid)."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D float tensor, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight has NaN or infinite values")
    n, k = w.shape
    groups = -(-k // group_size)
    pad = groups * group_size - k
    padded = nn.functional.pad(w, (0, pad)).reshape(n, groups, group_size)
    valid = nn.functional.pad(torch.ones(k, dtype=torch.bool), (0, pad)).reshape(groups, group_size)
    lo = torch.where(valid, padded, torch.full_like(padded, float("inf"))).amin(dim=2)
    hi = torch.where(valid, padded, torch.full_like(padded, float("-inf"))).amax(dim=2)
    scales, offsets = group_grid(lo, hi, symmetric)
    levels = torch.clamp(torch.round((padded - offsets.float()[..., None]) / scales.float()[..., None]), 0, 15)
    u = levels.reshape(n, groups * group_size)[:, :k].to(torch.uint8)
    if k % 2:
        u = nn.functional.pad(u, (0, 1))
    packed = u[:, 0::2] | (u[:, 1::2] << 4)
    return packed.contiguous(), scales.contiguous(), offsets.contiguous()


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group_size: int,
                    in_features: int) -> torch.Tensor:
    """The float32 weight [N, K] the packed form stands for (scale * u + offset, one rounding)."""
    n = packed.shape[0]
    u = torch.stack([packed & 15, packed >> 4], dim=2).reshape(n, -1)[:, :in_features].float()
    s = scales.float().repeat_interleave(group_size, dim=1)[:, :in_features]
    o = offsets.float().repeat_interleave(group_size, dim=1)[:, :in_features]
    return torch.addcmul(o, u, s)


class Int4WeightOnlyLinear(Tracked, nn.Module):
    """4-bit group-wise weights kept packed in row tiles, their float16 scales and offsets in the matching
    group tiles (weight_tiles.py), float activations (see the module docstring). Scales and offsets given
    in another float dtype are rounded to float16 (values from quantize_int4 or a GGUF Q4_1 block already
    are float16); ones beyond its range are a ValueError."""

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
                 group_size: int, in_features: int, symmetric: bool, activations: str = "float"):
        super().__init__()
        if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != (in_features + 1) // 2:
            raise ValueError("Int4WeightOnlyLinear needs a uint8 [N, ceil(in_features / 2)] packed weight")
        for name, values in (("scales", scales), ("offsets", offsets)):
            if not values.is_floating_point() or not bool(torch.isfinite(values.to(torch.float16)).all()):
                raise ValueError(f"{name} must be finite float values within float16's range (|v| <= 65504), got "
                                 f"{values.dtype} values up to {float(values.float().abs().max()):g}")
        self.register_buffer("weight_tiles", tile_rows(packed))
        self.register_buffer("scale_tiles", tile_groups(scales))
        self.register_buffer("offset_tiles", tile_groups(offsets))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.group_size = int(group_size)
        self.in_features = int(in_features)
        self.out_features = int(packed.shape[0])
        self.symmetric = bool(symmetric)
        self.activations = check_activations(activations)

    def __setstate__(self, state):
        super().__setstate__(state)
        buffers = self._buffers
        if "weight_packed" in buffers:  # a model written when the weights were stored row by row
            buffers["weight_tiles"] = tile_rows(buffers.pop("weight_packed"))
            buffers["scale_tiles"] = tile_groups(buffers.pop("scales"))
            buffers["offset_tiles"] = tile_groups(buffers.pop("offsets"))
        for name in ("scale_tiles", "offset_tiles"):  # a model written when the group values were float32
            if buffers[name].dtype != torch.float16:
                buffers[name] = buffers[name].to(torch.float16)

    @property
    def weight_packed(self) -> torch.Tensor:
        """The packed weight [out_features, ceil(in_features / 2)] (a copy out of the row tiles)."""
        return untile_rows(self.weight_tiles, self.out_features, (self.in_features + 1) // 2)

    @property
    def scales(self) -> torch.Tensor:
        """The group scales float16 [out_features, groups] (a copy out of the tiles)."""
        return untile_groups(self.scale_tiles, self.out_features)

    @property
    def offsets(self) -> torch.Tensor:
        """The group offsets float16 [out_features, groups] (a copy out of the tiles)."""
        return untile_groups(self.offset_tiles, self.out_features)

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int = 32, symmetric: bool = False,
                   activations: str = "float") -> "Int4WeightOnlyLinear":
        packed, scales, offsets = quantize_int4(linear.weight, group_size, symmetric)
        return cls(packed, scales, offsets, linear.bias, group_size, linear.in_features, symmetric, activations)

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize_int4(self.weight_packed, self.scales, self.offsets, self.group_size, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            op = _WOQ4A8 if self.activations == "int8" else _WOQ4
            b = self._buffers  # read directly: nn.Module's attribute lookup costs ~1 us a call when decoding
            return op(x, b["weight_tiles"], b["scale_tiles"], b["offset_tiles"], self.group_size, self.in_features,
                      self.out_features, b["bias"])
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return nn.functional.linear(x, self.dequantized_weight().to(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, activations={self.activations}")
