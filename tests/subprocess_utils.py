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


def json_lines(proc: subprocess.CompletedProcess) -> list:
    """The stdout lines of a child that start with '{' or '[', parsed as JSON."""
    return [json.loads(line) for line in proc.stdout.splitlines() if line[:1] in "{["]
