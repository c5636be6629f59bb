"""The ops the compiled extension registered in the torch.ops.qbackend namespace, by name: the
providers' ops of one kind share a signature (`qbackend::<provider>_linear`, ...), so their fake
impls are registered for every op of that name the extension defines."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)


def _kernel_providers(names: set[str]) -> list[str]:
    """The providers the extension defines kernels for: each registers "<provider>_linear_prepack"."""
    tail = "_linear_prepack"
    return sorted(n[len("qbackend::"):-len(tail)] for n in names if n.startswith("qbackend::") and n.endswith(tail))


def ops_named(suffix: str) -> list[str]:
    """The qualified names ("qbackend::fbgemm_linear", ...) of the registered ops named
    "<provider>_<suffix>" for each kernel provider (suffix "linear" matches fbgemm_linear, not
    fbgemm_linear_dynamic nor the weight-only qbackend::woq_linear, whose signature differs)."""
    names = set(torch._C._dispatch_get_all_op_names())
    return [f"qbackend::{p}_{suffix}" for p in _kernel_providers(names) if f"qbackend::{p}_{suffix}" in names]
