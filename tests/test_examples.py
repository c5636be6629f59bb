"""The README's example script (CI also runs it), in a child process as a user would."""
import os

from tests.subprocess_utils import REPO, run_example


def test_quantize_and_compare_script():
    proc = run_example("quantize_and_compare.py")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| layer | op | mode |")  # explain
    assert any(l.startswith("Output over 17 batches: SQNR ") for l in lines)  # compare
    assert any(l.startswith("Metric: FP32 ") for l in lines)
    rows = [l.split("|") for l in lines if l.startswith(("| conv1 |", "| conv2 |", "| fc |"))
            and len(l.split("|")) == 8]  # compare's 6 columns (explain's rows have 8)
    assert [r[1].strip() for r in rows] == ["conv1", "conv2", "fc"]
    assert all(float(r[4]) > 25 for r in rows)  # SQNR vs FP32 (dB) of each layer
    last = lines[-1]
    assert last.startswith("most sensitive layer: ") and "top-1 FP32 " in last


def test_readme_shows_the_script_as_it_is():
    code = open(os.path.join(REPO, "examples", "quantize_and_compare.py")).read()
    body = code.split('"""', 2)[2].strip("\n")
    readme = open(os.path.join(REPO, "README.md")).read()
    assert f"```python\n{body}\n```" in readme, "README's Example section differs from examples/quantize_and_compare.py"
