"""The collectives the reduction uses, on a torch.distributed gloo process group, each bounded by
a timeout and failing with a `DistributedCalibrationError` that says which rank and which step:

* `roll_call`: every rank sends to and hears from every other one, so a rank that died (its
  connections closed: detected at once) or never arrives (detected at the timeout) is named on
  every rank that is still there, before anything is reduced;
* `all_gather_bytes`: each rank's uint8 buffer to every rank (sizes first, then the buffers
  padded to the longest);
* `all_reduce_sum`: a tensor summed in place across ranks (gloo's ring: every rank gets the same
  bits)."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

__all__ = ["DistributedCalibrationError", "check_group", "roll_call", "all_gather_bytes", "all_reduce_sum"]


class DistributedCalibrationError(RuntimeError):
    """The ranks could not reduce their calibration statistics: a rank failed, timed out or
    disagrees about the model or its configuration."""


def check_group(group) -> tuple[int, int]:
    """(rank, world size) in `group` (None: the default group), which must be a gloo group."""
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedCalibrationError("torch.distributed is not initialized: call "
                                          "torch.distributed.init_process_group('gloo') first (torchrun sets the "
                                          "environment it reads)")
    backend = dist.get_backend(group)
    if backend != "gloo":
        raise ValueError(f"group must be a gloo process group (calibration statistics are CPU tensors), got a "
                         f"{backend!r} group")
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def roll_call(group, timeout: datetime.timedelta) -> None:
    """Returns once every rank of the group has answered; else raises naming the ranks that did not."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peers = [p for p in range(world) if p != rank]
    mine = torch.tensor([rank], dtype=torch.int64)
    heard = {p: torch.full((1,), -1, dtype=torch.int64) for p in peers}
    failed, sends, recvs = {}, [], {}
    for p in peers:  # posting to a peer whose connection is closed raises at once
        try:
            sends.append(dist.isend(mine, dst=_global(group, p), group=group))
            recvs[p] = dist.irecv(heard[p], src=_global(group, p), group=group)
        except RuntimeError as exc:
            failed[p] = _first_line(exc)
    deadline = time.monotonic() + timeout.total_seconds()  # one timeout for the whole roll call

    def left() -> datetime.timedelta:
        return datetime.timedelta(seconds=max(0.001, deadline - time.monotonic()))

    for p, work in recvs.items():
        try:
            work.wait(left())
        except RuntimeError as exc:
            failed[p] = _first_line(exc)
            continue
        if int(heard[p]) != p:
            failed[p] = f"answered as rank {int(heard[p])} (a message outside the reduction?)"
    for work in sends:
        try:
            work.wait(left())
        except RuntimeError:
            pass  # a send to a failed rank: reported through its receive
    if failed:
        how = "; ".join(f"rank {p}: {why}" for p, why in sorted(failed.items()))
        raise DistributedCalibrationError(
            f"rank {rank}: rank(s) {', '.join(map(str, sorted(failed)))} did not reach the calibration "
            f"reduction (within {timeout}, or the process ended) ({how})")


def _wait(work, step: str, group, timeout: datetime.timedelta) -> None:
    try:
        work.wait(timeout)
    except RuntimeError as exc:
        raise DistributedCalibrationError(
            f"rank {dist.get_rank(group)}: the reduction's {step} failed: a rank ended or did not answer within "
            f"{timeout} ({_first_line(exc)})") from exc


def all_gather_bytes(data: torch.Tensor, group, timeout: datetime.timedelta, step: str) -> list[torch.Tensor]:
    """Every rank's `data` (1-D uint8), in rank order."""
    world = dist.get_world_size(group)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    _wait(dist.all_gather(sizes, size, group=group, async_op=True), f"{step} (sizes)", group, timeout)
    longest = int(max(int(s) for s in sizes))
    padded = data
    if data.numel() < longest:
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:data.numel()] = data
    out = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    _wait(dist.all_gather(out, padded, group=group, async_op=True), step, group, timeout)
    return [o[:int(s)] for o, s in zip(out, sizes)]


def all_reduce_sum(tensor: torch.Tensor, group, timeout: datetime.timedelta, step: str) -> None:
    """Sum `tensor` across ranks, in place."""
    _wait(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True), step, group, timeout)
