"""Loads the C++ extension qbackend._C once, with the ISA override applied first.

Loading it registers the torch.ops.qbackend ops (their C++ kernels); the Python fake/meta
implementations live beside each op's Python wrapper in qbackend.ops.
"""
from __future__ import annotations

from . import isa

isa.set_library_environment()

import torch  # noqa: E402  (after the environment above: torch's libraries read it lazily)

try:
    from .. import _C  # noqa: E402
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "qbackend's C++ extension qbackend._C is missing or does not match this torch "
        f"({torch.__version__}); reinstall qbackend (see README). Cause: {exc}"
    ) from exc

isa.apply_cap(_C)


def usable_isa() -> isa.Isa:
    """The ISA level qbackend's own kernels use here (after QBACKEND_ISA)."""
    return isa.Isa(int(_C.usable_isa()))


__all__ = ["_C", "torch", "usable_isa"]
