"""What machine and checkout a benchmark ran on, for the reports' headers: the CPU's model name,
its qbackend ISA summary, the load average and the git commit qbackend was built from."""
from __future__ import annotations

import os
import subprocess

import qbackend
from qbackend.core.extension import _C


def cpu_model_name(default: str | None = None) -> str:
    """The CPU's marketing name from /proc/cpuinfo (else `default`, else qbackend's probe's)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default if default is not None else qbackend.cpu_features().model_name


def cpu_line() -> str:
    """The report's CPU line: name, vendor, logical CPUs, qbackend's ISA class and FBGEMM's ISA, AMX."""
    feats = qbackend.cpu_features()
    return (f"- CPU: {cpu_model_name()} ({feats.vendor}), {os.cpu_count()} logical CPUs; ISA class "
            f"`{feats.isa_class}` (level {feats.level_name}), FBGEMM ISA `{_C.fbgemm_isa()}`, "
            f"AMX: {'yes' if feats.amx_int8.usable else 'no'}")


def load_average() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:
        return "n/a"


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(qbackend.__file__)))


def git_commit() -> str:
    """The short commit of the qbackend checkout, or "unknown"."""
    try:
        return subprocess.run(["git", "-C", _root(), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def git_state() -> str:
    """The commit the (editable) qbackend was built from, and whether its sources had local changes."""
    root = _root()
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "csrc", "qbackend", "setup.py"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "git state unknown"
    if not head:
        return "not a git checkout"
    return f"git {head}" + (", with uncommitted changes in csrc/qbackend" if dirty else "")


def run_lines(threads) -> list[str]:
    """The header lines every timing report starts with: the CPU, the thread counts, the versions and
    commit, the date and the load average at the start."""
    import datetime

    import torch

    return [cpu_line(),
            f"- threads: {', '.join(map(str, threads))} (`torch.set_num_threads`)",
            f"- torch {torch.__version__}, qbackend {qbackend.__version__} ({git_state()})",
            f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start "
            f"{load_average()} (other processes compete for the {os.cpu_count()} CPUs when this is well above 0)"]


def write_report(report: str, out: str | None) -> None:
    """Print the report; with `out`, also write it there (its folder made if needed)."""
    print("\n" + report)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(report + "\n")
