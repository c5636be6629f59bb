"""Normalising the batches users pass (calibration data, evaluation data): each batch is a tensor
(one positional input), a tuple or list of positional inputs, or a dict of keyword inputs; and
binding inputs passed by name to a captured graph's positional inputs."""
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


def bind_by_name(arg_names: list[str], n_args: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of a call to a graph captured with n_args positional inputs named arg_names
    (the model's forward parameters): inputs passed by keyword whose names follow the positional
    ones given are moved to their place, as the model's own signature binds them. Other calls are
    returned as they are (the caller checks their structure)."""
    if kwargs and len(args) < n_args:
        names = list(arg_names)[len(args):n_args]
        if len(names) == n_args - len(args) and all(name in kwargs for name in names):
            kwargs = dict(kwargs)
            args = (*args, *(kwargs.pop(name) for name in names))
    return args, kwargs
