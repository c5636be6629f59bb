"""The `qbackend` command line, run as a user would: in a child process."""
import sys

from tests.subprocess_utils import run_py


def _cli(*args, env=None):
    code = f"import sys; from qbackend.cli import main; sys.exit(main({list(args)!r}))"
    return run_py(code, env=env)


def test_info_lists_features_override_and_routes():
    proc = _cli("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for word in ("avx512_vnni", "amx_int8", "| feature | CPU has it | OS allows it |", "| linear |", "| conv2d |"):
        assert word in out
    assert "QBACKEND_ISA unset" in out or "QBACKEND_ISA=" in out


def test_info_shows_override_in_force():
    proc = _cli("info", env={"QBACKEND_ISA": "avx2"})
    assert proc.returncode == 0, proc.stderr
    assert "override: QBACKEND_ISA=avx2" in proc.stdout
    assert "dispatch class avx2" in proc.stdout and "FBGEMM: avx2" in proc.stdout
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in proc.stdout


def test_python_dash_m_entry_point():
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "qbackend", "info"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Routes on this CPU class" in proc.stdout


def test_demo_reports_int8_accuracy_and_speed():
    proc = _cli("demo", "--batch", "8", "--features", "64")
    assert proc.returncode == 0, proc.stderr
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| INT8")]
    assert {r.split("|")[1].strip() for r in rows} == {"INT8 fbgemm", "INT8 onednn"}
    for r in rows:
        sqnr = float(r.split("|")[4])
        assert 25 < sqnr < 80, r  # 8-bit (or 7-bit) quantization of a random layer: ~30-45 dB


def test_bad_arguments_exit_nonzero():
    proc = _cli("nonsense")
    assert proc.returncode != 0
