"""The README's example scripts (CI also runs them), in child processes as a user would."""
import os
import subprocess
import sys

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


def test_distributed_calibration_example_on_two_ranks():
    """examples/distributed_calibration.py under torchrun, 2 ranks on loopback, as the docs say."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           os.path.join(REPO, "examples", "distributed_calibration.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert any(l.startswith("2 ranks, 6 calibration batches (3 on rank 0); reduced ") for l in lines), proc.stdout
    top1 = [l for l in lines if l.startswith("test top-1: FP32 ")]
    assert len(top1) == 1, proc.stdout  # printed by rank 0 only
    fp32, int8 = (float(x.split()[-1].rstrip("%,")) for x in top1[0].split(", "))
    assert fp32 > 95 and int8 >= fp32 - 1.0, top1
