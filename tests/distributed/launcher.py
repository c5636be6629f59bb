"""Start N ranks of a gloo process group on 127.0.0.1 in spawned processes, each running one
scenario of scenarios.py, bounded in time; what each rank writes under the output folder is the
test's evidence, and its exit code says whether the scenario returned (0) or raised (1; its
traceback written beside the evidence).

A rank ends with os._exit right after its scenario, without destroy_process_group: torch's gloo /
TCPStore teardown, racing a peer that tears down or exits at the same moment, sometimes aborted
rank 0 ("terminate called without an active exception", exit -6) after its scenario had passed
(1 run in several under load). That teardown is not what the scenarios test; a rank that ends
early is what some of them test, and ending at once is what a finished rank does here."""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import scenarios


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, scenario: str, out: str, params: dict) -> None:
    code = 1
    try:
        torch.set_num_threads(1)  # the reference runs on one thread too: the same FP32 results per batch
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        getattr(scenarios, scenario)(rank, world, out, **params)
        code = 0
    except BaseException:  # noqa: BLE001  (recorded as evidence; the exit code says it raised)
        with open(os.path.join(out, f"rank{rank}.traceback"), "w") as f:
            f.write(traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no process-group teardown (module docstring)


def run_ranks(scenario: str, world: int, out: str, timeout: float = 240, **params) -> dict[int, int]:
    """Run `scenario` on `world` ranks; returns rank -> exit code (killed after `timeout` seconds)."""
    port = _free_port()
    ctx = mp.start_processes(_rank_main, args=(world, port, scenario, out, params), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    for p in ctx.processes:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = {}
    for rank, p in enumerate(ctx.processes):
        if p.is_alive():
            p.kill()
            p.join()
            codes[rank] = "timeout"
        else:
            codes[rank] = p.exitcode
    return codes


def failures(out: str, codes: dict) -> str:
    """The tracebacks of the ranks that raised, for an assertion message."""
    text = [f"exit codes {codes}"]
    for name in sorted(os.listdir(out)):
        if name.endswith(".traceback"):
            with open(os.path.join(out, name)) as f:
                text.append(f"--- {name}\n{f.read()}")
    return "\n".join(text)


def read_json(out: str, name: str) -> dict:
    with open(os.path.join(out, name)) as f:
        return json.load(f)
