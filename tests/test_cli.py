"""The `qbackend` command line, run as a user would: in a child process."""
import json
import os
import subprocess
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


# ------------------------------------------------------------------------------------------- explain

def test_explain_a_saved_model(tmp_path):
    path = tmp_path / "m.qb"
    run_py(f"""
import torch, qbackend
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
x = torch.randn(4, 8)
qbackend.save(qbackend.quantize(m, (x,), [x]), {str(path)!r})
""", check=True)
    proc = _run(["-m", "qbackend", "explain", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert f"{path}: saved on " in proc.stdout and "routed here for" in proc.stdout
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| 0 |") or l.startswith("| 2 |")]
    assert len(rows) == 2 and all("| linear |" in r for r in rows)
    proc = _run(["-m", "qbackend", "explain", str(tmp_path / "nope.qb")])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------- compare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OUTLIER_CASE = '''
import torch
import qbackend

from tests.lowering.toy_models import Outlier

X = torch.randn(512, 16, generator=torch.Generator().manual_seed(1))


def case():
    model = Outlier().eval()
    with torch.no_grad():
        truth = model(X).argmax(1)

    def agree(m):
        with torch.no_grad():
            return 100.0 * float((m(X).argmax(1) == truth).float().mean())

    calib = [X[i:i + 64] for i in range(0, 256, 64)]
    # an example of 16 rows: outside the 7-bit table (M = 4 .. 7), so 8-bit activations on every CPU
    return model, (X[:16],), calib, calib, agree


def impossible():
    model, example, calib, evaluation, _ = case()
    return model, example, calib, evaluation, lambda m: -1.0 if isinstance(m, qbackend.QuantizedModel) else 0.0
'''

BAD_CASES = '''
import torch

def _parts():
    return torch.nn.Linear(2, 2).eval(), torch.zeros(1, 2), [torch.zeros(1, 2)], [torch.zeros(1, 2)]

def four(): return _parts()
def model_only(): return _parts()[0]
def not_a_model(): return ("model",) + _parts()[1:] + (None,)
def tensor_calibration(): m, x, _, e = _parts(); return m, x, torch.zeros(4, 2), e, None
def metric_not_callable(): return _parts() + (3,)
def raises(): return {}["missing"]
def training_mode(): m, x, c, e = _parts(); return m.train(), x, c, e, None
def no_metric(): return _parts() + (None,)
answer = 42
'''


def _run(argv, cwd=None, env=None, timeout=300):
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, child_env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=child_env, capture_output=True, text=True,
                          timeout=timeout)


def _compare(*args, cwd=REPO, pre=""):
    """`qbackend compare ARGS` in a child (after the statement `pre`, e.g. hiding an optional package)."""
    code = f"import sys\n{pre}\nfrom qbackend.cli import main\nsys.exit(main(['compare', *{list(args)!r}]))"
    return _run(["-c", code], cwd=cwd)


def _assert_one_line_error(proc, *texts):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qbackend compare: error: "), err
    assert "Traceback" not in err
    for t in texts:
        assert t in err, err


def test_compare_examples_case_rich_json_plot(tmp_path):
    """The README's command, from the repository root: rich tables, progress bars, --json, --plot."""
    out, png = tmp_path / "r.json", tmp_path / "sqnr.png"
    proc = _run(["-m", "qbackend", "compare", "examples.digits_case:case", "--json", str(out), "--plot", str(png)],
                cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "examples.digits_case:case: INT8 vs FP32 per layer" in text
    assert "┃ layer" in text and "SQNR vs FP32" in text and "metric FP32" in text  # rich tables
    for layer in ("conv1", "conv2", "fc"):
        assert f"│ {layer} " in text
    assert "most sensitive (the layer's own SQNR): " in text
    assert "calibrating" in proc.stderr and "compare" in proc.stderr  # the progress bars
    assert "Traceback" not in proc.stderr and "LeafSpec" not in proc.stderr
    result = json.loads(out.read_text())
    assert [l["name"] for l in result["layers"]] == ["conv1", "conv2", "fc"]
    assert all(l["sqnr_db"] > 25 for l in result["layers"])
    assert result["metric"]["fp32"] > 95 and abs(result["metric"]["drop"]) < 2
    assert sorted(result["ranked"]) == ["conv1", "conv2", "fc"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_compare_max_drop_keeps_the_outlier_layer_in_fp32(tmp_path):
    (tmp_path / "outlier_case.py").write_text(OUTLIER_CASE)
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    proc = _compare("outlier_case:case", "--max-drop", "1", "--markdown", "--no-progress", "--json", str(out),
                    "--plot", str(png), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [l.split("|")[1].strip() for l in lines if l.startswith("| fc")] == ["fc1", "fc3"]  # fc2 is FP32
    fallback = next(l for l in lines if l.startswith("fallback (--max-drop 1)"))
    assert "1 layer kept in FP32: fc2; budget met" in fallback
    assert any(l.startswith("latency on the example inputs: FP32 ") for l in lines)
    assert "calibrating" not in proc.stderr  # --no-progress
    assert "some ops stay in FP32" not in proc.stderr  # the fallback's own conversions are not warned about
    result = json.loads(out.read_text())
    assert result["fallback"]["kept_fp32"] == ["fc2"] and result["fallback"]["met"] is True
    assert result["fallback"]["steps"][0]["drop"] > 1
    assert png.stat().st_size > 5000


def test_compare_budget_not_met_exits_3(tmp_path):
    (tmp_path / "outlier_case.py").write_text(OUTLIER_CASE)
    proc = _compare("outlier_case:impossible", "--max-drop", "0.5", "--markdown", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "budget NOT met (the best model found is reported)" in proc.stdout
    assert "BudgetWarning" not in proc.stderr and "could not be met" not in proc.stderr


def test_compare_without_rich_prints_markdown_and_without_matplotlib_says_how(tmp_path):
    (tmp_path / "outlier_case.py").write_text(OUTLIER_CASE)
    proc = _compare("outlier_case:case", "--no-progress", cwd=tmp_path, pre="sys.modules['rich'] = None")
    assert proc.returncode == 0, proc.stderr
    assert "| layer | op | provider | SQNR vs FP32 (dB) | layer's own SQNR (dB) | rank |" in proc.stdout
    assert "┃" not in proc.stdout
    proc = _compare("outlier_case:case", "--plot", str(tmp_path / "p.png"), cwd=tmp_path,
                    pre="sys.modules['matplotlib'] = None")
    _assert_one_line_error(proc, "--plot needs matplotlib: pip install matplotlib")
    assert not (tmp_path / "p.png").exists()


BAD_SPECS = [
    ("no_such_module_xyz:case", ["cannot import no_such_module_xyz: no module named 'no_such_module_xyz'"]),
    ("bad_cases", ["expected package.module:function"]),
    ("bad_cases:nope", ["module bad_cases has no function 'nope'"]),
    ("bad_cases:fuor", ["has no function 'fuor'; did you mean four?"]),
    ("bad_cases:answer", ["bad_cases:answer is not callable (a int object)"]),
    ("bad_cases:four", ["bad_cases:four() returned 4 values; expected 5: (model, example_inputs"]),
    ("bad_cases:model_only", ["bad_cases:model_only() returned a Linear; expected a tuple (model,"]),
    ("bad_cases:not_a_model", ["model (value 1 of 5) must be a torch.nn.Module, got str"]),
    ("bad_cases:tensor_calibration", ["calibration_data (value 3 of 5) must be an iterable of batches",
                                      "got Tensor (wrap one batch in a list"]),
    ("bad_cases:metric_not_callable", ["metric (value 5 of 5) must be None or a function"]),
    ("bad_cases:raises", ["bad_cases:raises() raised KeyError: 'missing' (bad_cases.py:"]),
    ("bad_cases:training_mode", ["quantizing failed: ValueError: the model is in training mode"]),
    ("broken_import:case", ["importing broken_import failed: ModuleNotFoundError: No module named 'not_installed_dep'",
                            "(broken_import.py:1)"]),
    ("syntax_error:case", ["importing syntax_error failed: SyntaxError:", "(syntax_error.py:1)"]),
    ("bad_cases.py:four", ["bad_cases.py:four() returned 4 values"]),
    ("missing_file.py:case", ["cannot import missing_file.py: no such file"]),
]


def test_compare_bad_functions_get_one_line_and_exit_2(tmp_path):
    """Every bad module:function in one child (each through main(), stderr captured per call)."""
    (tmp_path / "bad_cases.py").write_text(BAD_CASES)
    (tmp_path / "broken_import.py").write_text("import not_installed_dep\n")
    (tmp_path / "syntax_error.py").write_text("def case(:\n")
    code = f"""
import contextlib, io, json, sys
from qbackend.cli import main
for spec in {[s for s, _ in BAD_SPECS]!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["compare", spec, "--no-progress"])
    print(json.dumps({{"spec": spec, "rc": rc, "stderr": err.getvalue()}}), flush=True)
"""
    proc = _run(["-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = {r["spec"]: r for r in map(json.loads, proc.stdout.splitlines())}
    for spec, texts in BAD_SPECS:
        r = got[spec]
        err = r["stderr"].strip()
        assert r["rc"] == 2, (spec, r)
        assert len(err.splitlines()) == 1 and err.startswith("qbackend compare: error: "), (spec, err)
        for t in texts:
            assert t in err, (spec, err)


def test_compare_bad_function_from_the_console(tmp_path):
    """The same, end to end: `python -m qbackend compare` and --path; --traceback shows the traceback."""
    (tmp_path / "bad_cases.py").write_text(BAD_CASES)
    proc = _run(["-m", "qbackend", "compare", "bad_cases:four"])  # not on sys.path from here
    _assert_one_line_error(proc, "cannot import bad_cases: no module named 'bad_cases'")
    proc = _run(["-m", "qbackend", "compare", "bad_cases:four", "--path", str(tmp_path)])
    _assert_one_line_error(proc, "bad_cases:four() returned 4 values")
    proc = _run(["-m", "qbackend", "compare", "bad_cases:raises", "--path", str(tmp_path), "--traceback"])
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "KeyError" in proc.stderr
    proc = _run(["-m", "qbackend", "compare", "bad_cases:no_metric", "--path", str(tmp_path), "--max-drop", "1"])
    _assert_one_line_error(proc, "--max-drop needs a metric")
