"""Fake (meta) impls of the observer ops, so torch.compile / torch.export can trace them:
torch.ops.qbackend.{finite_minmax, histogram_pow2, histogram_search_l2, histogram_quant_error}.

The C++ kernels (csrc/ops/observer_ops.cpp, which documents each op) register the ops when the
extension loads; the observers (qbackend.observers) are their users. Every result has a fixed
shape given the arguments, so the fakes need no data-dependent sizes.
"""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)

__all__: list[str] = []


@torch.library.register_fake("qbackend::finite_minmax")
def _finite_minmax_fake(x, axis=None):
    if axis is None:
        shape = ()
    else:
        torch._check_value(x.dim() >= 1 and -x.dim() <= axis < x.dim(),
                           lambda: f"axis must be in [{-x.dim()}, {x.dim()}) for x with {x.dim()} dimensions, "
                                   f"got {axis}")
        shape = (x.shape[axis],)
    f = torch.empty(shape, dtype=torch.float32, device=x.device)
    return f, torch.empty_like(f), torch.empty(shape, dtype=torch.int64, device=x.device)


@torch.library.register_fake("qbackend::histogram_pow2")
def _histogram_pow2_fake(x, log2_width, offset, bins):
    torch._check_value(bins >= 1, lambda: f"bins must be >= 1, got {bins}")
    scalar = torch.empty((), dtype=torch.float32, device=x.device)
    count = torch.empty((), dtype=torch.int64, device=x.device)
    return (torch.empty((bins,), dtype=torch.int64, device=x.device), scalar, torch.empty_like(scalar), count,
            torch.empty_like(count))


@torch.library.register_fake("qbackend::histogram_search_l2")
def _histogram_search_l2_fake(counts, log2_width, offset, min, max, levels):
    return torch.empty((2,), dtype=torch.float64, device=counts.device)


@torch.library.register_fake("qbackend::histogram_quant_error")
def _histogram_quant_error_fake(counts, log2_width, offset, min, max, first_center, step, levels):
    torch._check_value(first_center.dim() == 1 and first_center.shape == step.shape,
                       lambda: "first_center and step must be 1-D of one length")
    return torch.empty(first_center.shape, dtype=torch.float64, device=counts.device)
