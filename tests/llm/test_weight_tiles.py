"""Row tiles (qbackend.nn.weight_tiles), the weight-only Linears' weight layout: every byte where the
kernels' WeightTiles::at puts it (checked element by element against the definition), zero padding,
the round trip back to rows, bad arguments; the modules hold tiles, give their row-major weight back,
and still load the row-major state that models written before the layout hold."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qbackend.nn import Int4WeightOnlyLinear, WeightOnlyLinear
from qbackend.nn.weight_tiles import tile_rows, untile_rows


@pytest.mark.parametrize("n,b", [(1, 1), (4, 16), (5, 17), (6, 37), (9, 64), (3, 100)])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_every_byte_where_the_kernels_read_it(n, b, dtype):
    g = torch.Generator().manual_seed(n * 100 + b)
    w = torch.randint(-128 if dtype == torch.int8 else 0, 128, (n, b), generator=g, dtype=dtype)
    tiles = tile_rows(w)
    assert tiles.dtype == dtype and tiles.is_contiguous()
    assert tuple(tiles.shape) == ((n + 3) // 4, (b + 15) // 16, 64)
    flat = tiles.reshape(-1).tolist()
    tile_bytes = tiles.shape[1] * 64
    for row in range((n + 3) // 4 * 4):
        for byte in range(tiles.shape[1] * 16):
            # WeightTiles::at: tile + (b / 16) * 64 + j * 16 + b % 16
            at = row // 4 * tile_bytes + byte // 16 * 64 + row % 4 * 16 + byte % 16
            expected = int(w[row, byte]) if row < n and byte < b else 0
            assert flat[at] == expected, (row, byte)
    assert torch.equal(untile_rows(tiles, n, b), w)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="w must be a 2-D int8 or uint8 tensor"):
        tile_rows(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="w must be a 2-D int8 or uint8 tensor"):
        tile_rows(torch.zeros(4, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"tiles must be \[2, 1, 64\] for a weight of 5 rows of 16 bytes"):
        untile_rows(torch.zeros(1, 1, 64, dtype=torch.int8), 5, 16)


def _old_state(module: nn.Module, old_name: str, rows: torch.Tensor) -> dict:
    """The module's state as a model written before the row tiles holds it: the row-major weight
    under its old buffer name, and no tile buffer."""
    state = copy.copy(module.__dict__)
    buffers = dict(state["_buffers"])
    del buffers["weight_tiles"]
    state["_buffers"] = {old_name: rows, **buffers}
    return state


def test_modules_hold_tiles_and_load_row_major_state():
    torch.manual_seed(0)
    lin = nn.Linear(37, 6)
    x = torch.randn(3, 37)
    for module, old_name, rows in [
        (q := WeightOnlyLinear.from_float(lin), "weight_int8", q.weight_int8),
        (q4 := Int4WeightOnlyLinear.from_float(lin, 16), "weight_packed", q4.weight_packed),
    ]:
        assert tuple(module.weight_tiles.shape) == (2, 3 if old_name == "weight_int8" else 2, 64)
        assert torch.equal(untile_rows(module.weight_tiles, *rows.shape), rows)
        old = type(module).__new__(type(module))
        old.__setstate__(_old_state(module, old_name, rows.clone()))
        assert old_name not in old._buffers and torch.equal(old.weight_tiles, module.weight_tiles)
        assert (old.in_features, old.out_features) == (37, 6)
        torch.testing.assert_close(old(x), module(x), rtol=0, atol=0)
        torch.testing.assert_close(copy.deepcopy(module)(x), module(x), rtol=0, atol=0)
    err = (q.weight_int8.float() - lin.weight.detach() / q.w_scales).abs()
    assert float(err.max()) <= 0.5 + 1e-4  # the nearest level of each weight, in its row-major place
