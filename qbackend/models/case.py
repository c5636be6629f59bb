"""ModelCase: a model with its example, calibration and evaluation batches, the function that picks
its main output tensor, an optional task metric and the quantization mode it is meant for. Plus the
small helpers every builder shares (seeded construction, splitting a tensor into batches)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn


def identity(out):
    """The default ModelCase.output: the model's output is the main tensor."""
    return out


@dataclass
class ModelCase:
    """One model to quantize and compare.

    - model: eval mode, FP32.
    - example_inputs: one batch (positional args of model.forward).
    - calibration: calibration batches (positional args tuples).
    - evaluation: held-out batches, different from the calibration ones, same shapes.
    - output: model output -> the main tensor (e.g. ``out.last_hidden_state`` for BERT).
    - metric: (model) -> float, a task metric (top-1 % on a test split); None for random-init models.
    - mode: "static" or "dynamic".
    """

    name: str
    model: nn.Module
    example_inputs: tuple
    calibration: list[tuple]
    evaluation: list[tuple]
    output: Callable = identity
    metric: Callable | None = None
    mode: str = "static"

    def __post_init__(self):
        if self.mode not in ("static", "dynamic"):
            raise ValueError(f"ModelCase {self.name!r}: mode must be 'static' or 'dynamic', got {self.mode!r}")


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's global RNG seeded, restoring the caller's RNG state afterwards
    (module constructors draw their initial weights from the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_sizes(name: str, **sizes: int) -> None:
    for key, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: {key} must be a positive int, got {value!r}")
