"""What this CPU can do: the probed features (csrc/cpu/probe.cpp) and the QBACKEND_ISA cap.

`cpu_features()` returns a frozen `CpuFeatures`: for each feature whether the CPU has it and
whether the OS lets us use it, plus `level`, the ISA class qbackend actually uses after the cap.
The dispatcher routes on `isa_class` (one of ISA_CLASSES).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from ..core.extension import _C, usable_isa
from ..core import isa

# The CPU classes the rule table has columns for, fastest first.
ISA_CLASSES = ("amx", "avx512_vnni", "avx2_vnni", "avx512", "avx2")

FEATURE_NAMES = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni",
    "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
)


@dataclass(frozen=True)
class Feature:
    """One probed CPU feature: whether the CPU reports it and whether the OS lets us use it."""

    cpu: bool  # the CPU reports it (CPUID)
    os: bool   # the OS saves its state (XCR0) and, for AMX, granted the tile-data permission

    @property
    def usable(self) -> bool:
        return self.cpu and self.os


@dataclass(frozen=True)
class CpuFeatures:
    """This CPU: its probed features, the QBACKEND_ISA override and the ISA level in use."""

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
    level: isa.Isa        # the level qbackend's own kernels use (after the override)
    l2_bytes: int = 0     # L2 cache per core (CPUID; 0 where the CPU does not say): the AVX2 GEMM's blocking

    @property
    def level_name(self) -> str:
        return self.level.label

    @property
    def has_vnni(self) -> bool:
        """u8 x s8 dot products without 16-bit saturation (AVX512-VNNI, or AVX-VNNI) in use."""
        if self.level >= isa.Isa.AVX512_VNNI:
            return True
        return self.override in (None, "avx2_vnni") and self.avx_vnni.usable and self.level >= isa.Isa.AVX2

    @property
    def isa_class(self) -> str:
        """The column of the dispatch rule table this machine uses (one of ISA_CLASSES)."""
        if self.level >= isa.Isa.AMX:
            return "amx"
        if self.level == isa.Isa.AVX512_VNNI:
            return "avx512_vnni"
        if self.has_vnni:
            return "avx2_vnni"
        return "avx512" if self.level == isa.Isa.AVX512 else "avx2"

    @property
    def bf16_products_pay(self) -> bool:
        """Whether AVX512-BF16 dot products run faster than fp32 FMAs here (measured once per
        process, csrc/cpu/bf16_speed.cpp; False without AVX512-BF16)."""
        return bool(_C.bf16_products_pay())

    def features(self) -> dict[str, Feature]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Feature)}


@functools.lru_cache(maxsize=None)
def cpu_features() -> CpuFeatures:
    raw = _C.cpu_probe()
    feats = {name: Feature(*raw[name]) for name in FEATURE_NAMES}
    return CpuFeatures(
        vendor=raw["vendor"], model_name=raw["model_name"], override=isa.requested(),
        level=usable_isa(), l2_bytes=int(raw["l2_bytes"]), **feats,
    )


def fbgemm_isa() -> str:
    """The instruction set FBGEMM's kernels dispatch to in this process."""
    return _C.fbgemm_isa()
