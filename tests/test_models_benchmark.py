"""benchmarks/models.py --quick runs end to end (a smoke test so the script cannot rot; no timing
assertions): every flow is a row, a peer that is not installed is a row saying so, qbackend's rows
have numbers and a sane SQNR.

OpenVINO is hidden from the child (sitecustomize sets sys.modules["openvino"] = None, so
importlib.util.find_spec returns None and importing it fails), so the missing-peer row is tested
whether or not the optional benchmark dependencies are installed here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "models.py"

FLOW_LABELS = ["FP32 eager", "FP32 torch.compile", "BF16 autocast", "torch.ao FX x86",
               "PT2E X86InductorQuantizer + compile", "ONNX Runtime INT8 (QDQ)", "OpenVINO INT8 (NNCF)",
               "qbackend INT8 eager", "qbackend INT8 torch.compile"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(report: str) -> tuple[list[str], dict[str, list[str]]]:
    """The resnet18 table: (header cells, flow label -> the cells of its row)."""
    section = report.split("## resnet18", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    head = _cells(lines[0])
    rows = {}
    for line in lines[2:]:
        cells = _cells(line)
        if cells and cells[0] in FLOW_LABELS:
            rows[cells[0]] = cells
    return head, rows


def test_models_benchmark_quick(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['openvino'] = None\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hide), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = tmp_path / "models.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    report = out.read_text()
    assert report.startswith("# Whole-model INT8 benchmarks")
    assert "Threads: 2" in report and "ISA flags" in report and "torch 2.13" in report
    assert "## Headline" in report
    head, rows = _table(report)
    assert set(rows) == set(FLOW_LABELS), sorted(rows)
    col = {name: i for i, name in enumerate(head)}
    sqnr = next(i for name, i in col.items() if name.startswith("SQNR"))
    times = [i for name, i in col.items() if name.startswith("batch ")]
    assert len(times) == 2, head  # batch 1 and 4
    assert "not installed" in rows["OpenVINO INT8 (NNCF)"][-1]
    for label in ("FP32 eager", "qbackend INT8 eager", "qbackend INT8 torch.compile"):
        cells = rows[label]
        assert len(cells) == len(head), cells
        assert all(cells[i] not in ("-", "failed") for i in times), cells
    assert float(rows["qbackend INT8 eager"][sqnr]) > 10.0, rows["qbackend INT8 eager"]
    assert float(rows["qbackend INT8 eager"][col["quantize (s)"]]) > 0.0  # quantize time recorded
    for label in ("PT2E X86InductorQuantizer + compile", "ONNX Runtime INT8 (QDQ)"):
        cells = rows[label]
        # installed here: numbers or an error note; not installed: a row saying so
        assert cells[times[0]] != "-" or cells[-1], cells
