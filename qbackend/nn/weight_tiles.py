"""Row tiles: the memory layout of the weight-only Linears' weights (csrc/kernels/woq_kernels.h,
WeightTiles).

A weight of N rows of B bytes (int8 [N, K]: B = K; 4-bit packed [N, ceil(K / 2)]: B = ceil(K / 2))
is stored as [ceil(N / 4), ceil(B / 16), 64]: the rows in groups of four, each group as 16-byte chunks
of its four rows in turn, zero beyond B and beyond N. A pass of the kernels over four output channels
then reads one sequential stream of 64-byte lines, not four row streams: about twice the DRAM
bandwidth per core (benchmarks/results/epyc_zen4/weight_stream_layout.md).

The 4-bit weights' group scales and offsets [N, G] go with their tiles as [ceil(N / 4), G, 4]: for
each tile and group, the four rows' values side by side (zero for the rows a tile pads), so a kernel
reads one 16-byte vector per group, not four values from four rows.
"""
from __future__ import annotations

import torch

__all__ = ["tile_rows", "untile_rows", "tile_groups", "untile_groups", "TILE_ROWS", "CHUNK_BYTES"]

TILE_ROWS = 4
CHUNK_BYTES = 16


def tile_rows(w: torch.Tensor) -> torch.Tensor:
    """The row tiles [ceil(N / 4), ceil(B / 16), 64] of a 2-D int8 or uint8 weight [N, B]."""
    if w.dim() != 2 or w.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"w must be a 2-D int8 or uint8 tensor [N, B], got {tuple(w.shape)} {w.dtype}")
    n, b = w.shape
    tiles, chunks = -(-n // TILE_ROWS), -(-b // CHUNK_BYTES)
    padded = torch.nn.functional.pad(w.detach(), (0, chunks * CHUNK_BYTES - b, 0, tiles * TILE_ROWS - n))
    return padded.reshape(tiles, TILE_ROWS, chunks, CHUNK_BYTES).transpose(1, 2).reshape(
        tiles, chunks, TILE_ROWS * CHUNK_BYTES).contiguous()


def untile_rows(tiles: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """The 2-D weight [n, b] that `tile_rows` made `tiles` from."""
    count, chunks = -(-n // TILE_ROWS), -(-b // CHUNK_BYTES)
    if tuple(tiles.shape) != (count, chunks, TILE_ROWS * CHUNK_BYTES):
        raise ValueError(f"tiles must be [{count}, {chunks}, {TILE_ROWS * CHUNK_BYTES}] for a weight of {n} rows of "
                         f"{b} bytes, got {tuple(tiles.shape)}")
    rows = tiles.reshape(count, chunks, TILE_ROWS, CHUNK_BYTES).transpose(1, 2).reshape(
        count * TILE_ROWS, chunks * CHUNK_BYTES)
    return rows[:n, :b].contiguous()


def tile_groups(values: torch.Tensor) -> torch.Tensor:
    """Per-group values [N, G] (the 4-bit weights' scales or offsets) as float16 [ceil(N / 4), G, 4]
    (rounded to float16 where they are another float dtype)."""
    if values.dim() != 2 or not values.is_floating_point():
        raise ValueError(f"values must be a 2-D float tensor [N, G], got {tuple(values.shape)} {values.dtype}")
    n, groups = values.shape
    tiles = -(-n // TILE_ROWS)
    padded = torch.nn.functional.pad(values.detach().to(torch.float16), (0, 0, 0, tiles * TILE_ROWS - n))
    return padded.reshape(tiles, TILE_ROWS, groups).transpose(1, 2).contiguous()


def untile_groups(tiles: torch.Tensor, n: int) -> torch.Tensor:
    """The values [n, G] that `tile_groups` made `tiles` from."""
    count = -(-n // TILE_ROWS)
    if tiles.dim() != 3 or tiles.shape[0] != count or tiles.shape[2] != TILE_ROWS:
        raise ValueError(f"tiles must be [{count}, G, {TILE_ROWS}] for {n} rows, got {tuple(tiles.shape)}")
    return tiles.transpose(1, 2).reshape(count * TILE_ROWS, tiles.shape[1])[:n].contiguous()
