"""Run a fuzz tool's cases in child processes so that a crash (a segfault, an abort) is counted
and its case named instead of ending the run.

The worker side prints "S <i>" before case i and "R <json record>" after it; `run_in_children`
starts `python <script> --worker --start S --end E <extra>`, hands each record to `on_result`, and
after a child dies restarts from the case after the one it was running, calling
`on_crash(case, exit status, the child's stderr)`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_in_children(script: str, start: int, end: int, extra: list[str], key: str, on_result, on_crash) -> None:
    """Cases [start, end) of `script`; `key`: the record field holding the case's index."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    while start < end:
        cmd = [sys.executable, script, "--worker", "--start", str(start), "--end", str(end), *extra]
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
            current, done = None, start
            for line in proc.stdout:
                if line.startswith("S "):
                    current = int(line[2:])
                elif line.startswith("R "):
                    rec = json.loads(line[2:])
                    on_result(rec)
                    current, done = None, rec[key] + 1
            rc = proc.wait()
            if rc == 0 and current is None:
                return
            err.seek(0)
            crashed = current if current is not None else done
            on_crash(crashed, rc, err.read())
            start = crashed + 1
