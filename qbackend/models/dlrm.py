"""A DLRM-style recommendation model: sparse features through nn.EmbeddingBag tables (sum bags of
variable length), dense features through a bottom MLP, the pooled embeddings and the dense
vector concatenated into a top MLP that predicts a click logit. Random init (DLRM's: tables
uniform in +-sqrt(1 / rows), Linear layers torch's default), synthetic inputs: dense features
N(0, 1), indices uniform over each table (or Zipf-skewed with `zipf`), bag lengths uniform in
[min_bag, max_bag].

    forward(dense [B, num_dense], indices (T tensors, 1-D int64), offsets (T tensors, [B] int64))

``dlrm_case()`` builds the ModelCase (static mode: the MLPs go through the INT8 flow, the tables
through the embedding flow); ``dlrm_inputs()`` one batch. Sizes default to a small model; the
embedding benchmark uses 8 tables of 1M x 64 at batch 2048.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .case import ModelCase, check_sizes, generator, seeded


def _mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM-style: embedding-bag tables, a bottom MLP on the dense features, a top MLP on both."""

    def __init__(self, num_tables: int = 8, rows: int = 10_000, dim: int = 64, num_dense: int = 13,
                 bottom: tuple[int, ...] = (256, 128), top: tuple[int, ...] = (256, 128)):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(num_tables))
        bound = math.sqrt(1.0 / rows)
        with torch.no_grad():
            for t in self.tables:
                t.weight.uniform_(-bound, bound)
        self.bottom = _mlp([num_dense, *bottom, dim], last_relu=True)
        self.top = _mlp([dim * (num_tables + 1), *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, indices: tuple[torch.Tensor, ...],
                offsets: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [table(idx, off) for table, idx, off in zip(self.tables, indices, offsets)]
        return self.top(torch.cat([x, *pooled], 1))


def dlrm_inputs(batch_size: int, num_tables: int, rows: int, num_dense: int = 13, min_bag: int = 20,
                max_bag: int = 80, seed: int = 0, zipf: float | None = None) -> tuple:
    """One batch: (dense, indices tuple, offsets tuple)."""
    g = generator(seed)
    dense = torch.randn(batch_size, num_dense, generator=g)
    indices, offsets = [], []
    for _ in range(num_tables):
        lengths = torch.randint(min_bag, max_bag + 1, (batch_size,), generator=g)
        n = int(lengths.sum())
        if zipf is None:
            idx = torch.randint(0, rows, (n,), generator=g)
        else:  # P(rank k) ~ k^-zipf over a random permutation of the rows
            ranks = torch.arange(1, rows + 1, dtype=torch.float64)
            idx = torch.multinomial((ranks ** -zipf).float(), n, replacement=True, generator=g)
        indices.append(idx)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
    return dense, tuple(indices), tuple(offsets)


def dlrm(num_tables: int = 8, rows: int = 10_000, dim: int = 64, seed: int = 0, **kw) -> DLRM:
    with seeded(seed):
        return DLRM(num_tables, rows, dim, **kw).eval()


def dlrm_case(batch_size: int = 64, num_tables: int = 4, rows: int = 5_000, dim: int = 32,
              num_calibration_batches: int = 4, num_eval_batches: int = 2, seed: int = 0,
              min_bag: int = 20, max_bag: int = 80) -> ModelCase:
    check_sizes("dlrm", batch_size=batch_size, num_tables=num_tables, rows=rows, dim=dim,
                num_calibration_batches=num_calibration_batches, num_eval_batches=num_eval_batches)
    model = dlrm(num_tables, rows, dim, seed)

    def batch(s):
        return dlrm_inputs(batch_size, num_tables, rows, min_bag=min_bag, max_bag=max_bag, seed=seed * 1000 + s)

    return ModelCase("dlrm", model, batch(0), [batch(1 + i) for i in range(num_calibration_batches)],
                     [batch(100 + i) for i in range(num_eval_batches)])
