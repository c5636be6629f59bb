"""Fixed-seed uniform samples of a weight's output channels, for the convert-time searches that
measure an error on part of them (GPTQ's proxy errors, SmoothQuant's alpha search): the same
channels on every run and every machine."""
from __future__ import annotations

import torch

__all__ = ["sampled_rows"]


def sampled_rows(n: int, count: int) -> torch.Tensor | None:
    """The indices of `count` of n rows, uniformly sampled with seed 0, in increasing order; None
    where there are no more than `count` (all of them)."""
    if n <= count:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(0))[:count].sort().values
