"""Run Python snippets in a child interpreter, so a crash (segfault, abort) fails one test, not pytest."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def run_py(code: str, env: dict | None = None, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Run `sys.executable -c code` with `env` merged into os.environ; return the CompletedProcess.

    Raises AssertionError (with the child's output) if the child died from a signal, or, with
    check=True, if it exited with a non-zero status. stdout/stderr are text.
    """
    child_env = dict(os.environ)
    if env:
        child_env.update({k: str(v) for k, v in env.items()})
    proc = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        raise AssertionError(f"child Python was killed by {name}\n--- stdout ---\n{proc.stdout}"
                             f"\n--- stderr ---\n{proc.stderr}")
    if check and proc.returncode != 0:
        raise AssertionError(f"child Python exited with status {proc.returncode}\n--- stdout ---\n"
                             f"{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    return proc


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run examples/<script> in a child interpreter as a user would (the checkout on PYTHONPATH);
    asserts it exited with status 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", script)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc


def json_lines(proc: subprocess.CompletedProcess) -> list:
    """The stdout lines of a child that start with '{' or '[', parsed as JSON."""
    return [json.loads(line) for line in proc.stdout.splitlines() if line[:1] in "{["]


_OP_ERROR_CHILD = """
import json, torch, qbackend.ops
ops = torch.ops.qbackend
for opname, name, fn in [{cases}]:
    op = getattr(ops, opname)
    try:
        fn(op)
        r = {{"op": opname, "case": name, "type": None, "msg": "no exception"}}
    except Exception as e:
        r = {{"op": opname, "case": name, "type": type(e).__name__, "msg": str(e)}}
    print(json.dumps(r), flush=True)
"""


def run_op_error_cases(error_cases: dict) -> dict:
    """Run bad-input cases of torch.ops.qbackend ops in one child process (a crash fails the tests,
    not pytest). error_cases: {op name: [(case, expression of `op`, exception type, text), ...]}.
    Returns {(op, case): {"type": exception type name or None, "msg": message}}."""
    cases = ", ".join(f"({op!r}, {name!r}, lambda op: {expr})"
                      for op, cs in error_cases.items() for name, expr, _, _ in cs)
    proc = run_py(_OP_ERROR_CHILD.format(cases=cases))
    assert proc.returncode == 0, proc.stderr
    return {(r["op"], r["case"]): r for r in json_lines(proc)}


def assert_op_error(result: dict, exc: str, text: str) -> None:
    """The case raised `exc` with `text` in a short message (no C++ backtrace)."""
    assert result["type"] == exc, result
    assert text in result["msg"], result
    assert len(result["msg"]) < 400 and "Exception raised from" not in result["msg"], result


def op_error_params(error_cases: dict) -> list[tuple[str, str, str, str]]:
    """(op, case, exception type, text) for each case, to parametrize a test over."""
    return [(op, case, exc, text) for op, cs in error_cases.items() for case, _, exc, text in cs]
