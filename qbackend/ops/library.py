"""The ops the compiled extension registered in the torch.ops.qbackend namespace, by name: the
providers' ops of one kind share a signature (`qbackend::<provider>_linear`, ...), so their fake
impls are registered for every op of that name the extension defines."""
from __future__ import annotations

import torch

from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)


def ops_named(suffix: str) -> list[str]:
    """The qualified names ("qbackend::fbgemm_linear", ...) of the registered qbackend ops named
    "<provider>_<suffix>" (suffix "linear" matches fbgemm_linear, not fbgemm_linear_dynamic)."""
    return sorted(name for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("qbackend::") and name.endswith("_" + suffix))
