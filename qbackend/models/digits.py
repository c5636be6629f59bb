"""A small CNN trained on scikit-learn's bundled 8x8 digits (``sklearn.datasets.load_digits``, 1797
images, 10 classes, no download): the one zoo model with real weights and a real accuracy to lose.

Model: Conv(1, 16, 3, pad 1)-BN-ReLU, Conv(16, 32, 3, pad 1)-BN-ReLU, MaxPool 2x2, Linear(512, 10).
Data: pixels / 16 (to [0, 1]), images [N, 1, 8, 8] float32; a fixed stratified split (random_state 0)
of 60% train / 10% calibration / 30% test. Training: 15 epochs of Adam, batch 32, one-cycle
(cosine) learning-rate schedule peaking at 1e-2, fixed seed, on one thread (several times faster
than two for these tiny ops, and independent of the machine's thread count): about 2 s, 98.9% test
top-1. ``train_digits_cnn()`` trains once per process (functools.cache on the state_dict) and
returns a fresh model with the trained weights, the split and the training time;
``digits_cnn_case()`` builds the ModelCase (static mode, logits, metric = top-1 % on the test
split). ``python -m qbackend.models.digits`` trains and prints the accuracy and time.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .case import ModelCase, check_sizes, seeded


class DigitsCNN(nn.Module):
    """The demo's small CNN for scikit-learn's 8x8 digits: Conv-BN-ReLU x2, max pooling, a Linear head."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 1, 8, 8]
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        x = self.pool(x)
        return self.fc(torch.flatten(x, 1))


@dataclass
class DigitsSplit:
    """Images [N, 1, 8, 8] float32 in [0, 1], labels [N] int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_calib: torch.Tensor
    y_calib: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def clone(self) -> "DigitsSplit":
        return DigitsSplit(*(t.clone() for t in self.__dict__.values()))


class DigitsTraining(NamedTuple):
    """A trained DigitsCNN, its data split and the training time."""

    model: DigitsCNN         # eval mode, trained weights (a fresh copy on every call)
    split: DigitsSplit       # a fresh copy on every call
    train_seconds: float     # wall time of the (single, cached) training run


def digits_split(random_state: int = 0) -> DigitsSplit:
    """The fixed stratified 60 / 10 / 30 train / calibration / test split of load_digits."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.from_numpy(data.images).float().div_(16.0).unsqueeze(1)  # [1797, 1, 8, 8]
    y = torch.from_numpy(data.target).long()
    idx = torch.arange(len(y)).numpy()
    rest, test = train_test_split(idx, test_size=0.3, stratify=data.target, random_state=random_state)
    train, calib = train_test_split(rest, test_size=1 / 7, stratify=data.target[rest], random_state=random_state)
    t = lambda i: torch.from_numpy(i).long()  # noqa: E731
    return DigitsSplit(x[t(train)], y[t(train)], x[t(calib)], y[t(calib)], x[t(test)], y[t(test)])


@torch.no_grad()
def top1_percent(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 32, output=None) -> float:
    """Top-1 accuracy (%) of `model` on (x, y), run in batches of exactly `batch_size` (the last one
    padded with copies of its first image and the padding's predictions dropped), so models
    specialized to one batch shape work too. `output` maps the model output to the logits."""
    correct = 0
    for start in range(0, len(y), batch_size):
        xb = x[start:start + batch_size]
        n = len(xb)
        if n < batch_size:
            xb = torch.cat([xb, xb[:1].expand(batch_size - n, *xb.shape[1:])])
        logits = model(xb)
        logits = output(logits) if output is not None else logits
        correct += int((logits[:n].argmax(dim=1) == y[start:start + n]).sum())
    return 100.0 * correct / len(y)


@functools.cache
def _train(seed: int, epochs: int) -> tuple[dict, DigitsSplit, float]:
    split = digits_split()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is several times faster than two here, and the result is thread-count independent
    t0 = time.perf_counter()
    try:
        return _train_loop(split, seed, epochs, t0)
    finally:
        torch.set_num_threads(threads)


def _train_loop(split: DigitsSplit, seed: int, epochs: int, t0: float) -> tuple[dict, DigitsSplit, float]:
    with seeded(seed):
        model = DigitsCNN()
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
        batch_size = 32
        steps = epochs * ((len(split.y_train) + batch_size - 1) // batch_size)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
        model.train()
        for _ in range(epochs):
            perm = torch.randperm(len(split.y_train), generator=g)
            for start in range(0, len(perm), batch_size):
                i = perm[start:start + batch_size]
                if len(i) < 2:  # BatchNorm needs more than one value per channel
                    continue
                loss = F.cross_entropy(model(split.x_train[i]), split.y_train[i])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
        model.eval()
    seconds = time.perf_counter() - t0
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, split, seconds


def train_digits_cnn(seed: int = 0, epochs: int = 15) -> DigitsTraining:
    """The trained DigitsCNN (eval mode), the split and the training time. Trains once per process
    and (seed, epochs): later calls copy the cached weights into a new model."""
    state, split, seconds = _train(seed, epochs)
    model = DigitsCNN()
    model.load_state_dict(state)
    return DigitsTraining(model.eval(), split.clone(), seconds)


def digits_cnn_case(*, batch_size: int = 32, num_calibration_batches: int | None = None,
                    num_eval_batches: int | None = None, seed: int = 0) -> ModelCase:
    """Digits CNN ModelCase: calibration batches from the calibration split, evaluation batches from
    the test split (full batches only; None = as many as fit: 5 and 16 at batch 32), the first
    calibration batch as the example; static mode; metric = top-1 % on the whole test split."""
    check_sizes("digits_cnn", batch_size=batch_size)
    model, split, _ = train_digits_cnn(seed)

    def batches(x: torch.Tensor, n: int | None, what: str) -> list[tuple]:
        fit = len(x) // batch_size
        n = fit if n is None else n
        if not 1 <= n <= fit:
            raise ValueError(f"digits_cnn: {what} split has {len(x)} images: 1..{fit} batches of {batch_size}, "
                             f"asked for {n}")
        return [(x[i * batch_size:(i + 1) * batch_size],) for i in range(n)]

    calibration = batches(split.x_calib, num_calibration_batches, "calibration")
    evaluation = batches(split.x_test, num_eval_batches, "test")
    metric = functools.partial(top1_percent, x=split.x_test, y=split.y_test, batch_size=batch_size)
    return ModelCase(name="digits_cnn", model=model, example_inputs=calibration[0], calibration=calibration,
                     evaluation=evaluation, metric=metric, mode="static")


if __name__ == "__main__":
    model, split, seconds = train_digits_cnn()
    print(f"digits CNN: test top-1 {top1_percent(model, split.x_test, split.y_test):.2f}% "
          f"({len(split.y_test)} images), trained in {seconds:.2f} s (on one thread)")
