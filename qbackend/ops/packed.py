"""Packed weights: one object per layer holding the int8 weight, its per-channel scales, the fp32
bias, the provider it runs on and that provider's packed form.

With `batch_routes` (dispatch/batch_routes.py: size ranges, each with its provider) a packed weight
holds one packed form per provider in them and each call runs on the provider of its size (conv2d:
the batch, linear: the rows); `provider` is the one of the example input's size (also used where
the size is symbolic, under torch.export with a dynamic batch). A provider that refuses the
geometry when packed leaves its sizes to `provider`.

They pickle (and deep-copy) as the int8 weight plus metadata, never as the packed bytes, and
repack when loaded, for the saved provider or for another (`with_provider`, or `from_state`).
"""
from __future__ import annotations

from typing import Sequence

import copy
import operator

import torch

from ..core.generation import Tracked
from ..core.routes import BatchRoutes
from ..core.state_version import check_state_version
from . import conv_geometry
from .providers import Provider, get_provider

FORMAT_VERSION = 1


def _as_scales(w_scales, n: int, what: str) -> torch.Tensor:
    s = torch.as_tensor(w_scales)
    if s.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"w_scales must be float32 (or float64), got {s.dtype}")
    s = s.to(torch.float32).reshape(-1).contiguous()
    if s.numel() != n:
        raise ValueError(f"w_scales must have {n} elements (one per output channel of the {what}), got {s.numel()}")
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise ValueError("w_scales must be finite and positive")
    return s


def _as_bias(bias, n: int) -> torch.Tensor | None:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
        got = f"a {bias.dtype} tensor" if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise TypeError(f"bias must be a float tensor or None, got {got}")
    b = bias.detach().to(torch.float32).reshape(-1).contiguous()
    if b.numel() != n:
        raise ValueError(f"bias must have {n} elements, got {b.numel()}")
    return b


def _check_weight(weight, ndim: int, what: str) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.int8:
        raise TypeError(f"weight must be an int8 tensor, got "
                        f"{weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.dim() != ndim or weight.numel() == 0:
        raise ValueError(f"weight must be a non-empty {ndim}-D {what} weight, got shape {tuple(weight.shape)}")
    if weight.device.type != "cpu":
        raise ValueError(f"weight must be a CPU tensor, got device {weight.device}")
    return weight.detach().contiguous()


def _as_routes(batch_routes) -> BatchRoutes | None:
    if batch_routes is None or isinstance(batch_routes, BatchRoutes):
        return batch_routes
    key, ranges = batch_routes  # the pickled form: [key, [[last, provider], ...]]
    return BatchRoutes.from_list(key, ranges)


class _Packed(Tracked):
    """Shared pickling / copying / repacking of the packed weights, and the choice of packed form
    by size where the weight has batch routes."""

    provider: Provider
    packed: object
    batch_routes: BatchRoutes | None = None
    _forms = None  # with batch routes: ((last size or None, (provider, packed form)), ...)

    def _pack_for(self, provider: Provider, size: int):
        raise NotImplementedError

    def _init_routes(self, batch_routes) -> None:
        """Pack for every provider of `batch_routes` (the example size's is packed already). Routes
        that do not name this weight's provider, or name only it, are dropped: one form."""
        routes = _as_routes(batch_routes)
        self.batch_routes, self._forms = None, None
        if routes is None or len(routes.providers) < 2 or self.provider.name not in routes.providers:
            return
        forms = {self.provider.name: (self.provider, self.packed)}
        first = 1
        for last, name in routes.ranges:
            if name not in forms:
                p = get_provider(name)
                try:
                    forms[name] = (p, self._pack_for(p, first))
                except ValueError:  # a geometry it refuses (e.g. oneDNN's depthwise bugs): the main provider's
                    forms[name] = forms[self.provider.name]
            first = (last or 0) + 1
        self.batch_routes = routes
        self._forms = tuple((last, forms[name]) for last, name in routes.ranges)

    def _form(self, size) -> tuple[Provider, object]:
        """(provider, packed form) for a call of this size (an int; a symbolic one takes `provider`)."""
        if self._forms is not None and isinstance(size, int):
            for last, form in self._forms:
                if last is None or size <= last:
                    return form
        return self.provider, self.packed

    @property
    def packed_providers(self) -> tuple[str, ...]:
        """Every provider this weight is packed for (one unless it has batch routes)."""
        return self.batch_routes.providers if self.batch_routes is not None else (self.provider.name,)

    def _routes_repr(self) -> str:
        return "" if self.batch_routes is None else f", batch_routes={self.batch_routes.describe()!r}"

    def _routes_state(self):
        return None if self.batch_routes is None else [self.batch_routes.key, self.batch_routes.to_list()]

    def _state(self) -> dict:
        raise NotImplementedError

    def __getstate__(self) -> dict:
        return {"format_version": FORMAT_VERSION, **self._state()}

    def __setstate__(self, state: dict) -> None:
        check_state_version(state.get("format_version"), (FORMAT_VERSION,), f"{type(self).__name__} state")
        state = {k: v for k, v in state.items() if k != "format_version"}
        self.__init__(**state)

    @classmethod
    def from_state(cls, state: dict, provider: str | None = None):
        """Rebuild from `__getstate__()`'s dict, repacking for `provider` (default: the saved one)."""
        obj = cls.__new__(cls)
        obj.__setstate__(dict(state, provider=provider or state["provider"]))
        return obj

    def with_provider(self, provider: str):
        """The same weight repacked for another provider (only: batch routes are dropped)."""
        return type(self).from_state(dict(self.__getstate__(), batch_routes=None), provider)

    def __deepcopy__(self, memo):
        return type(self).from_state(copy.deepcopy(self.__getstate__(), memo))

    @property
    def provider_name(self) -> str:
        return self.provider.name


class PackedLinearWeight(_Packed):
    """int8 weight [out_features, in_features] (symmetric per-channel), scales, bias, packed form."""

    def __init__(self, weight: torch.Tensor, w_scales, bias: torch.Tensor | None = None, provider: str = "fbgemm",
                 x_shape: Sequence[int] | None = None, batch_routes=None):
        """batch_routes: by rows (m) of x (see the module docstring)."""
        self.weight = _check_weight(weight, 2, "linear")
        self.out_features, self.in_features = self.weight.shape
        self.w_scales = _as_scales(w_scales, self.out_features, "linear")
        self.bias = _as_bias(bias, self.out_features)
        self.x_shape = list(x_shape) if x_shape is not None else None
        self.provider = get_provider(provider)
        # Decided once, here (not inside a traced forward): can this provider multiply 8-bit activations
        # exactly on this CPU? Re-decided when the weight is repacked (loaded) elsewhere.
        self.exact_8bit = bool(self.provider.exact_8bit())
        self.packed = self.provider.prepack_linear(self.weight, self.x_shape)
        self._init_routes(batch_routes)

    def _pack_for(self, provider: Provider, size: int):
        return provider.prepack_linear(self.weight, [size, self.in_features])

    def _state(self) -> dict:
        return {"weight": self.weight, "w_scales": self.w_scales, "bias": self.bias,
                "provider": self.provider.name, "x_shape": self.x_shape, "batch_routes": self._routes_state()}

    def _rows_form(self, x: torch.Tensor) -> tuple[Provider, object]:
        if self._forms is None:
            return self.provider, self.packed
        return self._form(x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0)

    def linear(self, x: torch.Tensor, x_scale: float, x_zero_point: int, output_scale: float = 1.0,
               output_zero_point: int = 0, output_dtype: torch.dtype = torch.float32,
               post_op: str = "none") -> torch.Tensor:
        """y = post_op(dequant(x) @ dequant(w).T + bias), returned as output_dtype (uint8/int8 requantized)."""
        provider, packed = self._rows_form(x)
        return provider.linear(x, x_scale, x_zero_point, packed, self.w_scales, self.bias,
                               output_scale, output_zero_point, output_dtype, post_op)

    def linear_dynamic(self, x: torch.Tensor, reduce_range: bool | None = None, post_op: str = "none") -> torch.Tensor:
        """fp32 in, fp32 out; x quantized per call to uint8 over its own range (7-bit where the
        provider would saturate 8-bit products, when reduce_range is None)."""
        provider, packed = self._rows_form(x)
        if reduce_range is None:
            reduce_range = not (self.exact_8bit if provider is self.provider else provider.exact_8bit())
        return provider.linear_dynamic(x, packed, self.w_scales, self.bias, reduce_range, post_op)

    def __repr__(self) -> str:
        return (f"PackedLinearWeight(out_features={self.out_features}, in_features={self.in_features}, "
                f"provider={self.provider.name!r}, bias={self.bias is not None}{self._routes_repr()})")


class PackedConv2dWeight(_Packed):
    """int8 conv weight [OC, IC/groups, KH, KW] (symmetric per-channel), geometry, scales, bias, packed form."""

    def __init__(self, weight: torch.Tensor, w_scales, bias: torch.Tensor | None = None,
                 stride: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0), dilation: Sequence[int] = (1, 1),
                 groups: int = 1, provider: str = "onednn", x_shape: Sequence[int] | None = None,
                 x_qparams: tuple[float, int] | None = None, batch_routes=None):
        """x_shape and x_qparams (x_scale, x_zero_point) are hints: the shape and activation qparams
        the layer will mostly run with (oneDNN chooses its weight format for them). batch_routes:
        by batch size (see the module docstring)."""
        self.weight = _check_weight(weight, 4, "conv2d")
        self.stride, self.padding, self.dilation = (_pair(stride, "stride"), _pair(padding, "padding"),
                                                    _pair(dilation, "dilation"))
        self.groups = conv_geometry.check_geometry(self.weight.shape, _as_int(groups, "groups"), self.padding,
                                                   x_shape)
        self.out_channels = self.weight.shape[0]
        self.in_channels = self.weight.shape[1] * self.groups
        self.kernel_size = tuple(self.weight.shape[2:])
        self.w_scales = _as_scales(w_scales, self.out_channels, "conv2d")
        self.bias = _as_bias(bias, self.out_channels)
        self.x_shape = list(x_shape) if x_shape is not None else None
        self.x_qparams = (float(x_qparams[0]), int(x_qparams[1])) if x_qparams is not None else None
        self.provider = get_provider(provider)
        self.packed = self.provider.prepack_conv2d(self.weight, self.w_scales, self.stride, self.padding,
                                                   self.dilation, self.groups, self.x_shape, self.x_qparams)
        self._init_routes(batch_routes)

    def _pack_for(self, provider: Provider, size: int):
        x_shape = None if self.x_shape is None else [size, *self.x_shape[1:]]
        return provider.prepack_conv2d(self.weight, self.w_scales, self.stride, self.padding, self.dilation,
                                       self.groups, x_shape, self.x_qparams)

    def _state(self) -> dict:
        return {"weight": self.weight, "w_scales": self.w_scales, "bias": self.bias, "stride": self.stride,
                "padding": self.padding, "dilation": self.dilation, "groups": self.groups,
                "provider": self.provider.name, "x_shape": self.x_shape, "x_qparams": self.x_qparams,
                "batch_routes": self._routes_state()}

    def conv2d(self, x: torch.Tensor, x_scale: float, x_zero_point: int, output_scale: float = 1.0,
               output_zero_point: int = 0, output_dtype: torch.dtype = torch.float32, post_op: str = "none",
               accum: torch.Tensor | None = None, accum_scale: float = 1.0, accum_zero_point: int = 0) -> torch.Tensor:
        """y = post_op(conv(dequant(x), dequant(w)) + bias [+ dequant(accum)]), channels-last output."""
        conv_geometry.check_input(x, self.weight.shape, self.groups, self.padding)
        provider, packed = self._form(x.shape[0]) if self._forms is not None else (self.provider, self.packed)
        return provider.conv2d(x, x_scale, x_zero_point, packed, self.w_scales, self.bias, self.stride,
                               self.padding, self.dilation, self.groups, output_scale, output_zero_point,
                               output_dtype, post_op, accum, accum_scale, accum_zero_point)

    def conv2d_add_(self, x: torch.Tensor, x_scale: float, x_zero_point: int, output_scale: float,
                    output_zero_point: int, output_dtype: torch.dtype, post_op: str, accum: torch.Tensor,
                    accum_scale: float, accum_zero_point: int) -> torch.Tensor:
        """conv2d with a residual the caller gives up (nothing reads accum afterwards): providers that
        can write the result into accum do (saving a copy of it) and return it; the others return
        conv2d's result and leave accum alone. accum must have the output's dtype."""
        provider, packed = self._form(x.shape[0]) if self._forms is not None else (self.provider, self.packed)
        fn = provider.conv2d_add_ if accum.dtype == output_dtype else None
        if fn is None:
            return self.conv2d(x, x_scale, x_zero_point, output_scale, output_zero_point, output_dtype, post_op,
                               accum, accum_scale, accum_zero_point)
        conv_geometry.check_input(x, self.weight.shape, self.groups, self.padding)
        fn(x, x_scale, x_zero_point, packed, self.w_scales, self.bias, self.stride, self.padding,
           self.dilation, self.groups, output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
           accum_zero_point)
        return accum

    def __repr__(self) -> str:
        return (f"PackedConv2dWeight({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"provider={self.provider.name!r}{self._routes_repr()})")


def _as_int(v, name: str) -> int:
    """An int (or integer-like: numpy / torch integers); bools and floats are refused."""
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {v!r}") from None


def _pair(v, name: str) -> list[int]:
    vals = [int(v)] * 2 if isinstance(v, int) else [int(e) for e in v]
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {v!r}")
    return vals
