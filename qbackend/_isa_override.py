"""QBACKEND_ISA: cap the instruction sets qbackend believes in and uses, to simulate older CPUs.

Applied once, when qbackend is imported, before FBGEMM or oneDNN run a kernel:
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

import os
import warnings

# name -> (our level, ONEDNN_MAX_CPU_ISA, FBGEMM_ENABLE_INSTRUCTIONS)
ISA_LEVELS = {
    "avx2": (1, "AVX2", "AVX2"),
    "avx2_vnni": (1, "AVX2_VNNI", "AVX2"),
    "avx512": (2, "AVX512_CORE", "AVX512"),
    "avx512_vnni": (3, "AVX512_CORE_VNNI", "AVX512_E1"),
    "amx": (4, "AVX512_CORE_AMX", "AVX512_E1"),
}
LEVEL_NAMES = {0: "scalar", 1: "avx2", 2: "avx512", 3: "avx512_vnni", 4: "amx"}


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
        ext.set_isa_cap(ISA_LEVELS[name][0], name not in ("avx2", "avx512"))
