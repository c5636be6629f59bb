"""Rowwise-quantized embedding ops: quantize_rowwise's levels, every bag mode / bit width / qparams
dtype / index dtype against an fp64 dequantize-then-reduce reference (to fp32 rounding), the
providers (builtin, fbgemm, and fbgemm_gpu when installed) bit for bit, empty bags, and bad indices / offsets / weights raising before any row is
read."""
from __future__ import annotations

import itertools

import pytest
import torch

from qbackend.ops.embedding import (EMBEDDING_PROVIDERS, PackedEmbeddingTable, _fbgemm_gpu_available,
                                    dequantize_rowwise, quantize_rowwise)
from tests.ops.numerics import embedding_bags_fp64, embedding_levels

OPS = torch.ops.qbackend
HAVE_FBGEMM_GPU = _fbgemm_gpu_available()


def _table(rows=40, dim=16, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=g) * scale


def _bags(n_bags, rows, seed, dtype, include_last, padding_idx=None, empty_bag=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 7, (n_bags,), generator=g)
    if empty_bag:
        lengths[1] = 0
    n = int(lengths.sum())
    indices = torch.randint(0, rows, (n,), generator=g)
    if padding_idx is not None and n > 2:
        indices[::3] = padding_idx
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    if not include_last:
        offsets = offsets[:-1]
    psw = torch.rand(n, generator=g) * 2 - 0.5
    return indices.to(dtype), offsets.to(dtype), psw


# per_sample_weights go with sum bags only (as in nn.EmbeddingBag)
CASES = [c for c in itertools.product([8, 4], [torch.float16, torch.float32], ["sum", "mean"],
                                      [torch.int32, torch.int64], [False, True], [None, 3], [False, True])
         if not (c[2] == "mean" and c[4])]


@pytest.mark.parametrize("bits,qp,mode,idx_dtype,weighted,padding_idx,include_last", CASES)
def test_builtin_bags_match_fp64_reference(bits, qp, mode, idx_dtype, weighted, padding_idx, include_last):
    dim, rows = 24, 40
    table = quantize_rowwise(_table(rows, dim, seed=bits), bits, qp)
    indices, offsets, psw = _bags(9, rows, seed=5, dtype=idx_dtype, include_last=include_last,
                                  padding_idx=padding_idx)
    psw = psw if weighted else None
    out = OPS.embedding_bag_rowwise(table, dim, bits, indices, offsets, {"sum": 0, "mean": 1}[mode], psw,
                                    include_last, -1 if padding_idx is None else padding_idx)
    ref, mag = embedding_bags_fp64(table, dim, bits, indices, offsets, mode, psw, include_last,
                          -1 if padding_idx is None else padding_idx)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    # fp32 rounding: one fma per term (and the mean's scaling), accumulated over <= 7 terms
    bound = 2.0 ** -23 * 8 * mag[:, None] + 1e-30
    assert bool(((out.double() - ref).abs() <= bound).all()), (out.double() - ref).abs().max()
    assert bool((out[1] == 0).all())  # the empty bag


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_rowwise_levels(bits):
    w = _table(64, 32, seed=1)
    w[5] = 0.25  # a constant row: exact
    for qp in (torch.float16, torch.float32):
        t = quantize_rowwise(w, bits, qp)
        assert t.dtype == torch.uint8 and t.shape == (64, (32 if bits == 8 else 16) + (4 if qp == torch.float16 else 8))
        scale, bias, q = embedding_levels(t, 32, bits)
        assert float(q.min()) >= 0 and float(q.max()) <= (1 << bits) - 1
        deq = scale[:, None] * q + bias[:, None]
        # each value is within half a level of the original (plus the qparams' own rounding)
        err = (deq - w.double()).abs()
        slack = scale[:, None] * 0.5 + (1e-3 if qp == torch.float16 else 1e-6) * w.double().abs().amax(1, keepdim=True)
        assert bool((err <= slack + 1e-12).all())
        assert torch.equal(dequantize_rowwise(t, 32, bits), deq.float())
        assert bool((deq[5] == 0.25).all())


def test_quantize_rowwise_rejects_bad_tables():
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_rowwise(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="float16 range"):
        quantize_rowwise(torch.tensor([[-1e6, 1e6]]))
    quantize_rowwise(torch.tensor([[-1e6, 1e6]]), qparams_dtype=torch.float32)  # fp32 qparams hold it
    with pytest.raises(ValueError, match="even embedding dim"):
        quantize_rowwise(torch.randn(3, 5), bits=4)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        quantize_rowwise(torch.randn(3, 4), bits=2)
    with pytest.raises(TypeError, match="float tensor"):
        quantize_rowwise(torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="non-empty 2-D"):
        quantize_rowwise(torch.randn(4))


def _providers(table, dim, bits):
    """The table packed for every provider available here (fbgemm_gpu only if installed)."""
    return {p: PackedEmbeddingTable(table, dim, bits, p) for p in EMBEDDING_PROVIDERS
            if p != "fbgemm_gpu" or HAVE_FBGEMM_GPU}


@pytest.mark.parametrize("bits,mode,weighted,include_last,idx_dtype",
                         [c for c in itertools.product([8, 4], ["sum", "mean"], [False, True], [False, True],
                                                       [torch.int32, torch.int64]) if not (c[1] == "mean" and c[2])])
def test_providers_agree_bit_for_bit(bits, mode, weighted, include_last, idx_dtype):
    dim, rows = 32, 100
    table = quantize_rowwise(_table(rows, dim, seed=3), bits)
    packed = _providers(table, dim, bits)
    indices, offsets, psw = _bags(33, rows, seed=7, dtype=idx_dtype, include_last=include_last)
    outs = {p: t.bag(indices, offsets, mode, psw if weighted else None, include_last) for p, t in packed.items()}
    assert len(outs) >= 2
    for p, out in outs.items():
        assert torch.equal(out, outs["builtin"]), p
        assert torch.equal(packed[p].table(), table)


def test_lookup_is_the_dequantized_rows():
    dim = 16
    table = quantize_rowwise(_table(30, dim), 8)
    idx = torch.tensor([[0, 29, 3], [3, 3, 7]])
    for p, t in _providers(table, dim, 8).items():
        out = t.lookup(idx)
        assert out.shape == (2, 3, dim)
        assert torch.equal(out, dequantize_rowwise(table, dim, 8)[idx]), p
    assert OPS.embedding_rowwise(table, dim, 8, idx).shape == (2, 3, dim)


BAD = [
    ("index out of range", torch.tensor([0, 40]), torch.tensor([0]), None, False, IndexError, "out of range"),
    ("negative index", torch.tensor([0, -1]), torch.tensor([0]), None, False, IndexError, "out of range"),
    ("offsets not from 0", torch.tensor([0, 1]), torch.tensor([1]), None, False, ValueError, "offsets\\[0\\] must be 0"),
    ("decreasing offsets", torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1]), None, False, ValueError,
     "non-decreasing"),
    ("last offset beyond", torch.tensor([0, 1]), torch.tensor([0, 3]), None, True, ValueError, "beyond the number"),
    ("weights length", torch.tensor([0, 1]), torch.tensor([0]), torch.ones(3), False, ValueError,
     "one weight per index"),
    ("offsets dtype", torch.tensor([0, 1]), torch.tensor([0], dtype=torch.int32), None, False, TypeError,
     "dtype of indices"),
    ("float indices", torch.tensor([0.0, 1.0]), torch.tensor([0]), None, False, TypeError, "int32 or (torch.)?int64"),
    ("2-D indices", torch.tensor([[0, 1]]), torch.tensor([0]), None, False, ValueError, "1-D"),
]


@pytest.mark.parametrize("provider", ["builtin", "fbgemm", "fbgemm_gpu"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_indices_and_offsets_raise(provider, case):
    if provider == "fbgemm_gpu" and not HAVE_FBGEMM_GPU:
        pytest.skip("fbgemm-gpu-cpu is not installed")
    _, indices, offsets, psw, include_last, exc, match = case
    t = PackedEmbeddingTable(quantize_rowwise(_table(40, 8), 8), 8, 8, provider)
    with pytest.raises(exc, match=match):
        t.bag(indices, offsets, "sum", psw, include_last)


def test_bad_call_arguments_raise():
    table = quantize_rowwise(_table(10, 8), 8)
    idx, off = torch.tensor([1, 2]), torch.tensor([0])
    with pytest.raises(ValueError, match="only supported with mode sum"):
        OPS.embedding_bag_rowwise(table, 8, 8, idx, off, 1, torch.ones(2))
    with pytest.raises(ValueError, match="padding_idx"):
        OPS.embedding_bag_rowwise(table, 8, 8, idx, off, 0, None, False, 10)
    with pytest.raises(ValueError, match="table rows must hold"):
        OPS.embedding_bag_rowwise(table, 16, 8, idx, off, 0)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        OPS.embedding_bag_rowwise(table, 8, 2, idx, off, 0)
    with pytest.raises(TypeError, match="torch.uint8"):
        OPS.embedding_bag_rowwise(table.float(), 8, 8, idx, off, 0)
    with pytest.raises(ValueError, match="contiguous"):
        OPS.embedding_bag_rowwise(table, 8, 8, torch.tensor([1, 0, 2, 0])[::2], off, 0)
    with pytest.raises(ValueError, match="mode must be"):
        OPS.embedding_bag_rowwise(table, 8, 8, idx, off, 2)


def test_empty_inputs():
    table = quantize_rowwise(_table(10, 8), 8)
    e = torch.empty(0, dtype=torch.long)
    assert OPS.embedding_bag_rowwise(table, 8, 8, e, e, 0).shape == (0, 8)
    out = OPS.embedding_bag_rowwise(table, 8, 8, e, torch.zeros(3, dtype=torch.long), 1)
    assert out.shape == (3, 8) and bool((out == 0).all())


def test_fbgemm_refusals_are_clear():
    table32 = quantize_rowwise(_table(10, 8), 8, torch.float32)
    with pytest.raises(ValueError, match="fp16 scale/bias"):
        PackedEmbeddingTable(table32, 8, 8, "fbgemm")
    with pytest.raises(ValueError, match="fp16 scale/bias"):
        OPS.fbgemm_embedding_bag(table32, 8, 8, torch.tensor([1]), torch.tensor([0]), 0)
    if HAVE_FBGEMM_GPU:
        with pytest.raises(ValueError, match="fp16 scale/bias"):
            PackedEmbeddingTable(table32, 8, 8, "fbgemm_gpu")
    else:
        with pytest.raises(ValueError, match="not installed"):
            PackedEmbeddingTable(table32, 8, 8, "fbgemm_gpu")


def test_fake_impls_trace():
    table = quantize_rowwise(_table(10, 8), 8)

    def f(idx, off):
        return OPS.embedding_bag_rowwise(table, 8, 8, idx, off, 0) + OPS.embedding_rowwise(table, 8, 8, off).sum()

    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert torch.equal(compiled(idx, off), f(idx, off))


ISA_CHILD = """
import torch, qbackend
from qbackend import _C
from tests.ops.test_embedding import _bags, _table
from qbackend.ops.embedding import quantize_rowwise
ops = torch.ops.qbackend
top = int(_C.usable_isa())
for bits in (8, 4):
    table = quantize_rowwise(_table(200, 40, seed=9), bits)
    indices, offsets, psw = _bags(50, 200, seed=4, dtype=torch.int64, include_last=False, padding_idx=7)
    outs = {}
    for level in (0, 1, 2):  # scalar, AVX2, AVX512 builds (the cap forces FBGEMM too: a child process)
        if level <= top:
            _C.set_isa_cap(level)
            outs[level] = ops.embedding_bag_rowwise(table, 40, bits, indices, offsets, 0, psw, False, 7)
    assert len(outs) >= 2, outs.keys()
    for level, out in outs.items():
        assert torch.equal(out, outs[0]), (bits, level)
print("ok", sorted(outs))
"""


def test_builtin_isa_paths_give_the_same_bits():
    """The builtin kernel's scalar, AVX2 and AVX512 builds (std::fma everywhere) agree bit for bit."""
    from tests.subprocess_utils import run_py

    proc = run_py(ISA_CHILD, check=True)
    assert proc.stdout.startswith("ok"), proc.stdout
