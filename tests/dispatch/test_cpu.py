"""The CPU probe against an independent source (/proc/cpuinfo), and the QBACKEND_ISA override
keeping every kernel honest (our level, FBGEMM's ISA, oneDNN's ISA), checked in child processes."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

import qbackend
from qbackend.dispatch import cpu_features
from tests.subprocess_utils import json_lines, run_py

# Linux's /proc/cpuinfo flag for each probed feature.
LINUX_FLAGS = {
    "avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl",
    "avx512dq": "avx512dq", "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni", "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx_tile", "amx_int8": "amx_int8", "amx_bf16": "amx_bf16",
}


def _cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    pytest.skip("no flags line in /proc/cpuinfo")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="Linux only")
def test_probe_matches_proc_cpuinfo():
    flags = _cpuinfo_flags()
    f = cpu_features()
    for name, flag in LINUX_FLAGS.items():
        feat = getattr(f, name)
        # Linux lists a feature only when the kernel enables it, i.e. CPU has it AND the OS allows it
        # (for AMX, the tile permission is granted per process on request, so compare the CPU bit).
        expected = flag in flags
        got = feat.cpu if name.startswith("amx") else feat.usable
        assert got == expected, f"{name}: probe says {feat}, /proc/cpuinfo says {expected}"
    with open("/proc/cpuinfo") as fh:
        model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
    assert f.model_name == model
    assert f.vendor in ("GenuineIntel", "AuthenticAMD") or f.vendor


def test_features_are_frozen_and_consistent():
    f = cpu_features()
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.level = 0  # type: ignore[misc]
    for feat in f.features().values():
        assert not feat.os or feat.cpu, "the OS cannot allow what the CPU lacks"
    assert f.override is None or f.override in ("avx2", "avx2_vnni", "avx512", "avx512_vnni", "amx")
    # The level follows the usable features.
    if f.override is None:
        assert (f.level >= 3) == (f.avx512_vnni.usable and f.avx512f.usable and f.avx512bw.usable)
        assert (f.level >= 4) == (f.level >= 3 and f.amx_int8.usable and f.amx_tile.usable)
    assert qbackend.cpu_features is cpu_features


PROBE_CHILD = r"""
import json, os, torch, qbackend
from qbackend.dispatch import cpu_features, fbgemm_isa
from qbackend.ops import PackedLinearWeight
f = cpu_features()
# Run one oneDNN primitive so that ONEDNN_VERBOSE prints the ISA oneDNN settled on.
pw = PackedLinearWeight(torch.ones(8, 16, dtype=torch.int8), torch.ones(8), None, "onednn")
pw.linear(torch.ones(2, 16, dtype=torch.uint8), 0.1, 0)
print(json.dumps({"level": f.level, "class": f.isa_class, "fbgemm": fbgemm_isa(),
                  "onednn_env": os.environ.get("ONEDNN_MAX_CPU_ISA"), "override": f.override}))
"""

# override -> (our level, dispatch class, FBGEMM ISA, text oneDNN's verbose ISA line must contain, must not)
EXPECTED = {
    "avx2": (1, "avx2", "avx2", "AVX2", "DL Boost"),
    "avx512": (2, "avx512", "avx512", "AVX-512", "DL Boost"),
    "avx512_vnni": (3, "avx512_vnni", "avx512_vnni", "AVX-512 with Intel DL Boost", "bfloat16"),
}


@pytest.mark.parametrize("isa", sorted(EXPECTED))
def test_isa_override_caps_every_kernel(isa):
    f = cpu_features()
    level, klass, fb, must, must_not = EXPECTED[isa]
    if f.override is not None or f.level < level:
        pytest.skip(f"this CPU (level {f.level}) cannot show a cap at {isa}")
    proc = run_py(PROBE_CHILD, env={"QBACKEND_ISA": isa, "ONEDNN_VERBOSE": "1"}, check=True)
    (got,) = json_lines(proc)
    assert got["override"] == isa
    assert (got["level"], got["class"], got["fbgemm"]) == (level, klass, fb)
    isa_lines = [l for l in proc.stdout.splitlines() if ",info,cpu,isa:" in l]
    assert isa_lines, proc.stdout[-2000:]
    assert must in isa_lines[0] and must_not not in isa_lines[0], isa_lines[0]


def test_bad_override_value_is_a_clear_error():
    proc = run_py("import qbackend", env={"QBACKEND_ISA": "avx9000"})
    assert proc.returncode != 0
    assert "ValueError" in proc.stderr and "QBACKEND_ISA='avx9000'" in proc.stderr


def test_isa_override_warns_on_conflicting_library_variable():
    code = "import warnings; warnings.simplefilter('error'); import qbackend"
    proc = run_py(code, env={"QBACKEND_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert proc.returncode != 0 and "overrides ONEDNN_MAX_CPU_ISA=AVX512_CORE with AVX2" in proc.stderr


def test_isa_levels_mirror_the_extensions():
    from qbackend.core.extension import _C, usable_isa
    from qbackend.core.isa import Isa

    assert {m.name: m.value for m in Isa} == {name: int(v) for name, v in _C.Isa.__members__.items()}
    assert usable_isa() == Isa(int(_C.usable_isa())) == cpu_features().level


@pytest.mark.parametrize("isa", [None, "avx512_vnni", "avx2"])
def test_amx_self_check_first_thing_in_a_process(isa):
    """The AMX kernel's self-check, called before anything else has probed the CPU (so before the
    OS granted the tile permission), under each cap: the empty string where AMX runs, a message
    where it does not; never a fault."""
    code = ("import json, qbackend\nfrom qbackend.core.extension import _C\n"
            "print(json.dumps([_C.native_amx_self_check(False), int(_C.usable_isa())]))")
    proc = run_py(code, env={"QBACKEND_ISA": isa} if isa else None, check=True)
    out, level = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out == "") == (level >= 4), out
    assert out == "" or "AMX" in out


def test_lifting_a_cap_in_process_gives_fbgemm_its_own_isa_back():
    """A cap set and lifted inside a process (as tests do) leaves FBGEMM on the ISA it chose itself:
    weights it packed for that ISA must not run on the capped one's kernels."""
    from qbackend.core.extension import _C
    from qbackend.core.isa import requested

    own, before = _C.fbgemm_isa(), _C.isa_cap()
    vnni = requested() not in ("avx2", "avx512")
    try:
        _C.set_isa_cap(int(_C.Isa.AVX2), False)
        assert _C.fbgemm_isa() == "avx2"
        _C.set_isa_cap(-1, vnni)
        assert _C.fbgemm_isa() == own or before >= 0
    finally:
        _C.set_isa_cap(before, vnni)
    assert _C.fbgemm_isa() == own
