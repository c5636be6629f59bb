"""Normalising the batches users pass (calibration data, evaluation data): each batch is a tensor
(one positional input), a tuple or list of positional inputs, or a dict of keyword inputs."""
from __future__ import annotations

from typing import Iterable, Iterator

import torch


def batches(data: Iterable, what: str = "batches") -> Iterator[tuple[tuple, dict]]:
    """(args, kwargs) for each batch of `data`; `what` names the data in the TypeError for a batch
    of another type (e.g. "calibration batches")."""
    for batch in data:
        if isinstance(batch, torch.Tensor):
            yield (batch,), {}
        elif isinstance(batch, dict):
            yield (), batch
        elif isinstance(batch, (tuple, list)):
            yield tuple(batch), {}
        else:
            raise TypeError(f"{what} must be tensors, tuples of inputs or dicts of keyword inputs, "
                            f"got {type(batch).__name__}")
