"""The `qbackend` command line, run as a user would: in a child process."""
import json
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


def test_demo_prints_accuracy_latency_size_and_layers(tmp_path):
    out = tmp_path / "demo.json"
    proc = _cli("demo", "--batch", "1,4", "--rounds", "3", "--epochs", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "training the digits CNN" in proc.stderr  # progress lines go to stderr
    top1 = next(l for l in lines if l.startswith("| test top-1 (%) |")).split("|")
    assert 50 < float(top1[2]) <= 100 and 50 < float(top1[3]) <= 100
    assert [l.split("|")[1].strip() for l in lines if l.startswith("| latency")] == \
        ["latency, batch 1 (ms)", "latency, batch 4 (ms)"]
    assert any(l.startswith("| model size (bytes) |") for l in lines)
    assert sum(l.strip().split(" ")[0] in ("conv1", "conv2", "fc") for l in lines) == 3
    assert f"wrote {out}" in lines
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["latency"]] == [1, 4]
    assert result["size"]["int8_saved_bytes"] < result["size"]["fp32_state_dict_bytes"]


def test_demo_bad_option_is_one_line():
    proc = _cli("demo", "--batch", "1,x", "--quiet")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "qbackend demo: error: --batch takes comma-separated integers, got '1,x'"


def test_bad_arguments_exit_nonzero():
    proc = _cli("nonsense")
    assert proc.returncode != 0
