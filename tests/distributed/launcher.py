"""Start N ranks of a gloo process group on 127.0.0.1 in spawned processes, each running one
scenario of scenarios.py, bounded in time; what each rank writes under the output folder is the
test's evidence."""
from __future__ import annotations

import datetime
import json
import os
import socket
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
    torch.set_num_threads(1)  # the reference runs on one thread too: the same FP32 results per batch
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        getattr(scenarios, scenario)(rank, world, out, **params)
    except Exception:
        with open(os.path.join(out, f"rank{rank}.traceback"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
