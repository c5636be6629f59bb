"""Instruction-set levels (`Isa`) and QBACKEND_ISA, the cap on the instruction sets qbackend
believes in and uses, to simulate older CPUs.

`Isa` mirrors the C++ `qbackend::cpu::Isa` (csrc/cpu/probe.h): the level qbackend's own kernels
may use, ordered, each level implying the ones below. The cap is applied once, when qbackend is imported, before FBGEMM or oneDNN run a kernel:
  * our own kernels (csrc) are capped through qbackend._C.set_isa_cap;
  * FBGEMM is forced to the matching ISA with fbgemm::fbgemmForceIsa (it also reads
    FBGEMM_ENABLE_INSTRUCTIONS, which we set for child processes);
  * oneDNN reads ONEDNN_MAX_CPU_ISA once, when it creates its first primitive, so we set it
    here. oneDNN offers no way to ask which ISA it settled on, so the cap only reaches it if
    qbackend is imported before anything in the process ran a oneDNN primitive (any
    mkldnn/onednn op, quantized or not). Set QBACKEND_ISA in the environment of a fresh process;
    the tests check the cap took effect through ONEDNN_VERBOSE's ISA line.
"""
from __future__ import annotations

import enum
import os
import warnings


class Isa(enum.IntEnum):
    """The ISA level of qbackend's own kernels (the values of the C++ enum class)."""

    SCALAR = 0
    AVX2 = 1          # AVX2 + FMA
    AVX512 = 2        # AVX512 F, BW, VL, DQ
    AVX512_VNNI = 3   # AVX512 + VNNI (u8 x s8 dot products without 16-bit saturation)
    AMX = 4           # AVX512-VNNI + AMX tiles (tile-data permission granted)

    @property
    def label(self) -> str:
        return self.name.lower()


# QBACKEND_ISA value -> (the level it caps our kernels at, ONEDNN_MAX_CPU_ISA, FBGEMM_ENABLE_INSTRUCTIONS)
ISA_LEVELS = {
    "avx2": (Isa.AVX2, "AVX2", "AVX2"),
    "avx2_vnni": (Isa.AVX2, "AVX2_VNNI", "AVX2"),
    "avx512": (Isa.AVX512, "AVX512_CORE", "AVX512"),
    "avx512_vnni": (Isa.AVX512_VNNI, "AVX512_CORE_VNNI", "AVX512_E1"),
    "amx": (Isa.AMX, "AVX512_CORE_AMX", "AVX512_E1"),
}


def requested() -> str | None:
    """The QBACKEND_ISA value in force (lower-cased), or None. Raises ValueError on a bad value."""
    value = os.environ.get("QBACKEND_ISA", "").strip().lower()
    if not value:
        return None
    if value not in ISA_LEVELS:
        raise ValueError(
            f"QBACKEND_ISA={value!r} is not one of {', '.join(sorted(ISA_LEVELS))}"
        )
    return value


def set_library_environment() -> str | None:
    """Set the oneDNN/FBGEMM environment variables for QBACKEND_ISA. Call before torch loads them."""
    name = requested()
    if name is None:
        return None
    _, onednn, fbgemm = ISA_LEVELS[name]
    for var, val in (("ONEDNN_MAX_CPU_ISA", onednn), ("FBGEMM_ENABLE_INSTRUCTIONS", fbgemm)):
        old = os.environ.get(var)
        if old is not None and old.upper() != val:
            warnings.warn(f"QBACKEND_ISA={name} overrides {var}={old} with {val}", stacklevel=3)
        os.environ[var] = val
    return name


def apply_cap(ext) -> None:
    """Cap our kernels and FBGEMM in the loaded extension (called once after import)."""
    name = requested()
    if name is None:
        ext.set_isa_cap(-1, True)
    else:
        ext.set_isa_cap(int(ISA_LEVELS[name][0]), name not in ("avx2", "avx512"))
