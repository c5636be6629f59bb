"""Distributed calibration: wall time and bytes moved when BERT-base's calibration (SmoothQuant's
and GPTQ's statistics, the default config) is split over 1, 2 and 4 ranks on this machine
(gloo on 127.0.0.1), and the reduction's share of it.

    python benchmarks/distributed.py [--ranks 1,2,4] [--batches 8] [--out FILE]

Each rank is a spawned process with cpu_count // ranks threads (at least 1): it builds the model,
prepares it, waits at a barrier, then calibrates on its shard of the batches (round robin) and
calls qbackend.reduce_calibration. Wall time: from the barrier to the last rank's return. The
reduction proper excludes the roll call's wait for slower ranks. Afterwards every rank hashes its
reduced statistics: the ranks must agree.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import run_lines, write_report  # noqa: E402

import qbackend  # noqa: E402
from qbackend.distributed import statistics as stats  # noqa: E402
from qbackend.distributed.wire import encode  # noqa: E402
from qbackend.models.bert import bert_base, bert_inputs  # noqa: E402

SEQ, BATCH = 128, 8
NETWORK_GBIT = 10.0  # the stated link speed for the many-machine estimate


def _batches(n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    return [bert_inputs(BATCH, SEQ, g) for _ in range(n)]


def _rank(rank: int, world: int, port: int, batches: int, threads: int, out: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))
    data = _batches(batches)
    prepared = qbackend.prepare(bert_base(), data[0])
    shard = data[rank::world]
    dist.barrier()
    start = time.perf_counter()
    qbackend.calibrate(prepared, shard)
    calibrated = time.perf_counter()
    report = qbackend.reduce_calibration(prepared)
    done = time.perf_counter()
    digest = hashlib.sha256()
    for _, holder in prepared._prepared.statistics():
        state = stats.local_state(holder)
        digest.update(encode(state).numpy().tobytes())
        if getattr(holder, "products", None) is not None:
            digest.update(holder.hessian.numpy().tobytes())
    record = {"rank": rank, "batches": len(shard), "calibrate_s": calibrated - start, "reduce_s": done - calibrated,
              "roll_call_s": report.seconds_roll_call, "gather_s": report.seconds_gather,
              "sum_s": report.seconds_sum,
              "merge_s": report.seconds - report.seconds_roll_call - report.seconds_gather - report.seconds_sum,
              "end_s": done - start, "bytes_gathered": report.bytes_gathered,
              "bytes_sampled_rows": report.bytes_sampled_rows, "bytes_summed": report.bytes_summed,
              "statistics": report.statistics, "digest": digest.hexdigest(),
              "peak_rss_mb": _peak_rss_mb()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


def _collectives_rank(rank: int, world: int, port: int, sizes: list, out: str) -> None:
    """Sum fp64 buffers of `sizes` across ranks both ways, twice, interleaved: gloo's ring all-reduce
    (what reduce_calibration does) and reduce-to-an-owner-then-broadcast with owners rotating."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    buffers = [torch.randn(n, dtype=torch.float64) for n in sizes]

    def ring():
        for t in buffers:
            dist.all_reduce(t)

    def owner():
        for i, t in enumerate(buffers):
            dist.reduce(t, dst=i % world)
            dist.broadcast(t, src=i % world)

    times = {"ring": [], "owner": []}
    for _ in range(2):
        for name, fn in (("ring", ring), ("owner", owner)):
            dist.barrier()
            start = time.perf_counter()
            fn()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        with open(os.path.join(out, "collectives.json"), "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def collectives(world: int, sizes: list) -> dict:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_collectives_rank, args=(world, _free_port(), sizes, out), nprocs=world,
                           start_method="spawn", join=True)
        return json.load(open(os.path.join(out, "collectives.json")))


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, batches: int) -> list[dict]:
    threads = max(1, (os.cpu_count() or 1) // world)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, _free_port(), batches, threads, out), nprocs=world,
                           start_method="spawn", join=True)
        return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)], threads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows, states, sampled, summed = [], {}, {}, 0
    started = time.time()
    header = run_lines(["cpu_count // ranks per rank"])
    for world in (int(r) for r in args.ranks.split(",")):
        records, threads = run(world, args.batches)
        for r in records:
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "digest"},
                  file=sys.stderr)
        wall = max(r["end_s"] for r in records)
        slow = max(records, key=lambda r: r["end_s"])
        proper = max(r["reduce_s"] - r["roll_call_s"] for r in records)
        agree = len({r["digest"] for r in records}) == 1
        states[world] = records[0]["bytes_gathered"] - records[0]["bytes_sampled_rows"]
        sampled[world] = records[0]["bytes_sampled_rows"]
        summed = records[0]["bytes_summed"]
        rows.append(f"| {world} | {threads} | {'/'.join(str(r['batches']) for r in records)} | {wall:.2f} | "
                    f"{max(r['calibrate_s'] for r in records):.2f} | {proper:.2f} ({100 * proper / wall:.0f}%) | "
                    f"{slow['gather_s']:.2f} / {slow['sum_s']:.2f} | "
                    f"{states[world] / 1e6:.1f} / {sampled[world] / 1e6:.1f} | "
                    f"{summed / 1e6:.1f} | {max(r['peak_rss_mb'] for r in records):.0f} | {'yes' if agree else 'NO'} |")
        print(rows[-1], file=sys.stderr, flush=True)
    # the packed H of BERT-base's 12 layers: the inputs of q/k/v, the attention output, the FFN's up and down
    sizes = ([768 * 769 // 2] * 3 + [3072 * 3073 // 2]) * 12
    ways = []
    for world in (int(r) for r in args.ranks.split(",")):
        if world > 1:
            t = collectives(world, sizes)
            ways.append(f"| {world} | {min(t['ring']):.2f} | {min(t['owner']):.2f} |")
            print(ways[-1], file=sys.stderr, flush=True)
    per_rank_state = max(states[w] / w for w in states)
    rows_moved = max(sampled.values())
    gbyte_s = NETWORK_GBIT / 8
    at16_ring = 2 * 15 / 16 * summed
    at16_gather = 16 * per_rank_state + rows_moved
    report = "\n".join([
        "# Distributed calibration: BERT-base, statistics reduced across ranks on one machine", "",
        *header,
        f"- method: BERT-base (random init, {args.batches} calibration batches of {BATCH} x {SEQ} tokens, the "
        "default QuantConfig: SmoothQuant's channel statistics and GPTQ's Hessians beside the activation "
        "observers), the batches dealt round robin to the ranks; gloo on 127.0.0.1; each rank a spawned process. "
        "Wall: from a barrier after prepare to the last rank's return from reduce_calibration. Reduction: the "
        "longest reduce_calibration less its roll-call wait for slower ranks (share of the wall in brackets); "
        "gather / sum: the slowest rank's. Gathered: bytes rank 0 received in the gathers, padding and its own "
        "included: the statistics' states / SmoothQuant's sampled rows (each rank sends only the rows the merged "
        f"samples keep); summed: bytes of the fp64 Hessians' packed lower triangles, all-reduced. "
        f"{time.time() - started:.0f} s in all.", "",
        "| ranks | threads per rank | batches per rank | wall s | calibrate s (slowest rank) | reduction s | "
        "gather s / sum s | gathered MB (states / sampled rows) | summed MB | peak RSS per rank MB | "
        "ranks agree bit for bit |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"At 16 machines, one rank each, on {NETWORK_GBIT:g} Gbit/s links ({gbyte_s:.2f} GB/s each way): gloo's "
        f"ring all-reduce sends and receives 2 x 15/16 x {summed / 1e6:.0f} MB = {at16_ring / 1e6:.0f} MB per "
        f"machine, about {at16_ring / 1e9 / gbyte_s:.1f} s; the gathers bring each machine the 16 ranks' states, "
        f"16 x {per_rank_state / 1e6:.2f} MB, and the merged samples' rows, {rows_moved / 1e6:.0f} MB (about "
        f"the same at any number of ranks): {at16_gather / 1e6:.0f} MB, about {at16_gather / 1e9 / gbyte_s:.2f} s. "
        "Bandwidth only: latency, the padding of uneven gathers and the merge itself are not counted.", "",
        f"The Hessians' sums two ways ({sum(sizes) * 8 / 1e6:.0f} MB of fp64 in BERT-base's {len(sizes)} packed "
        "H, one thread per rank, the minimum of 2 interleaved rounds, seconds): gloo's ring all-reduce per H, "
        "which reduce_calibration uses, against a reduce to an owner rank and a broadcast from it per H, owners "
        "rotating.", "",
        "| ranks | ring all-reduce s | reduce to owner + broadcast s |", "|---|---|---|", *ways])
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
