"""What this CPU can do: the probed features (csrc/cpu/probe.cpp) and the QBACKEND_ISA cap.

`cpu_features()` returns a frozen `CpuFeatures`: for each feature whether the CPU has it and
whether the OS lets us use it, plus `level`, the ISA class qbackend actually uses after the cap.
The dispatcher routes on `isa_class` (amx, avx512_vnni, avx2_vnni, avx512, avx2).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from .._extension import _C
from .. import _isa_override

FEATURE_NAMES = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni",
    "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
)


@dataclass(frozen=True)
class Feature:
    cpu: bool  # the CPU reports it (CPUID)
    os: bool   # the OS saves its state (XCR0) and, for AMX, granted the tile-data permission

    @property
    def usable(self) -> bool:
        return self.cpu and self.os


@dataclass(frozen=True)
class CpuFeatures:
    vendor: str
    model_name: str
    avx2: Feature
    fma: Feature
    avx512f: Feature
    avx512bw: Feature
    avx512vl: Feature
    avx512dq: Feature
    avx512_vnni: Feature
    avx_vnni: Feature
    avx512_bf16: Feature
    amx_tile: Feature
    amx_int8: Feature
    amx_bf16: Feature
    override: str | None  # QBACKEND_ISA, if set
    level: int            # 0 scalar, 1 avx2, 2 avx512, 3 avx512_vnni, 4 amx (after the override)

    @property
    def level_name(self) -> str:
        return _isa_override.LEVEL_NAMES[self.level]

    @property
    def has_vnni(self) -> bool:
        """u8 x s8 dot products without 16-bit saturation (AVX512-VNNI, or AVX-VNNI) in use."""
        if self.level >= 3:
            return True
        return self.override in (None, "avx2_vnni") and self.avx_vnni.usable and self.level >= 1

    @property
    def isa_class(self) -> str:
        """The row of the dispatch rule table this machine uses."""
        if self.level >= 4:
            return "amx"
        if self.level == 3:
            return "avx512_vnni"
        if self.has_vnni:
            return "avx2_vnni"
        return "avx512" if self.level == 2 else "avx2"

    def features(self) -> dict[str, Feature]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Feature)}


@functools.lru_cache(maxsize=None)
def cpu_features() -> CpuFeatures:
    raw = _C.cpu_probe()
    feats = {name: Feature(*raw[name]) for name in FEATURE_NAMES}
    return CpuFeatures(
        vendor=raw["vendor"], model_name=raw["model_name"], override=_isa_override.requested(),
        level=_C.usable_level(), **feats,
    )


def fbgemm_isa() -> str:
    """The instruction set FBGEMM's kernels dispatch to in this process."""
    return _C.fbgemm_isa()
