"""qbackend::row_keys against its reference (torch int64 ops, bit for bit), its bad inputs, opcheck."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from qbackend.algorithms.smoothquant import key_multipliers
from qbackend.ops import reference as R

ops = torch.ops.qbackend


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (300, 64), (40, 3072), (0, 5)])
def test_row_keys_are_the_reference(shape):
    g = torch.Generator().manual_seed(shape[0] + shape[1])
    rows = torch.randn(shape, generator=g) * 1e3
    if shape[0] > 2:
        rows[1] = -0.0
        rows[2] = torch.finfo(torch.float32).max
    mult = key_multipliers(shape[1])
    assert torch.equal(ops.row_keys(rows, mult), R.row_keys(rows, mult))


def test_row_keys_read_strided_rows():
    rows = torch.randn(16, 9, generator=torch.Generator().manual_seed(1))
    mult = key_multipliers(16)
    assert torch.equal(ops.row_keys(rows.t(), mult), R.row_keys(rows.t().contiguous(), mult))


def test_bad_inputs_are_clear_errors():
    rows, mult = torch.randn(4, 6), key_multipliers(6)
    with pytest.raises(TypeError, match="rows must be float32"):
        ops.row_keys(rows.double(), mult)
    with pytest.raises(TypeError, match="multipliers must be int64"):
        ops.row_keys(rows, mult.int())
    with pytest.raises(ValueError, match="must be 2-D"):
        ops.row_keys(rows.reshape(2, 2, 6), mult)
    with pytest.raises(ValueError, match="length rows.size"):
        ops.row_keys(rows, key_multipliers(5))


def test_fake_impl_passes_opcheck():
    opcheck(ops.row_keys.default, (torch.randn(5, 8), key_multipliers(8)))
