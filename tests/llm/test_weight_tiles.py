"""Row tiles (qbackend.nn.weight_tiles), the weight-only Linears' weight layout: every byte where the
kernels' WeightTiles::at puts it (checked element by element against the definition), zero padding,
the round trip back to rows, the 4-bit weights' group tiles, bad arguments; the modules hold tiles, give
their row-major weight back, and still load the row-major state that models written before the layout
hold."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qbackend.nn import Int4WeightOnlyLinear, WeightOnlyLinear
from qbackend.nn.weight_tiles import tile_groups, tile_rows, untile_groups, untile_rows


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


def _old_state(module: nn.Module, old: dict) -> dict:
    """The module's state as a model written before the tiles holds it: the row-major weight (and, for
    4-bit weights, the [N, groups] scales and offsets) under their old buffer names, no tile buffers."""
    state = copy.copy(module.__dict__)
    buffers = {name: t for name, t in state["_buffers"].items() if not name.endswith("_tiles")}
    state["_buffers"] = {**old, **buffers}
    return state


def test_modules_hold_tiles_and_load_row_major_state():
    torch.manual_seed(0)
    lin = nn.Linear(37, 6)
    x = torch.randn(3, 37)
    q, q4 = WeightOnlyLinear.from_float(lin), Int4WeightOnlyLinear.from_float(lin, 16)
    assert tuple(q.weight_tiles.shape) == (2, 3, 64) and tuple(q4.weight_tiles.shape) == (2, 2, 64)
    assert tuple(q4.scale_tiles.shape) == tuple(q4.offset_tiles.shape) == (2, 3, 4)
    assert torch.equal(untile_rows(q.weight_tiles, 6, 37), q.weight_int8)
    assert torch.equal(untile_rows(q4.weight_tiles, 6, 19), q4.weight_packed)
    assert torch.equal(untile_groups(q4.scale_tiles, 6), q4.scales) and q4.scales.shape == (6, 3)
    assert float(q4.scale_tiles[1, :, 2:].abs().max()) == 0.0  # the padding rows' groups are zero
    old_states = [(q, {"weight_int8": q.weight_int8}),
                  (q4, {"weight_packed": q4.weight_packed, "scales": q4.scales, "offsets": q4.offsets})]
    for module, old in old_states:
        restored = type(module).__new__(type(module))
        restored.__setstate__(_old_state(module, old))
        assert not set(old) & set(restored._buffers)
        for name, t in module._buffers.items():
            assert (t is None and restored._buffers[name] is None) or torch.equal(restored._buffers[name], t), name
        assert (restored.in_features, restored.out_features) == (37, 6)
        torch.testing.assert_close(restored(x), module(x), rtol=0, atol=0)
        torch.testing.assert_close(copy.deepcopy(module)(x), module(x), rtol=0, atol=0)
    err = (q.weight_int8.float() - lin.weight.detach() / q.w_scales).abs()
    assert float(err.max()) <= 0.5 + 1e-4  # the nearest level of each weight, in its row-major place


def test_group_tiles_round_trip_and_bad_arguments():
    values = torch.randn(7, 5).half()
    tiles = tile_groups(values)
    assert tuple(tiles.shape) == (2, 5, 4) and tiles.dtype == torch.float16
    assert torch.equal(tile_groups(values.float()), tiles)  # float32 values of float16s: the same tiles
    for n in range(7):
        for g in range(5):
            assert float(tiles.reshape(-1)[n // 4 * 20 + g * 4 + n % 4]) == float(values[n, g])  # group_at
    assert torch.equal(untile_groups(tiles, 7), values)
    with pytest.raises(ValueError, match="values must be a 2-D float tensor"):
        tile_groups(torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"tiles must be \[3, G, 4\] for 9 rows"):
        untile_groups(tiles, 9)
