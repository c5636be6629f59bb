"""qbackend::quantize_per_row and qbackend::per_row_dequantize against their references (bit for
bit), the per-row qparams against observers.choose_qparams, bad inputs, opcheck of the fake impls,
and TokenQuantizedLinear on every provider against the fp64 math on the same integers."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from qbackend.core.extension import _C
from qbackend.nn import TokenQuantizedLinear
from qbackend.observers import choose_qparams
from qbackend.ops import PackedLinearWeight
from qbackend.ops import reference as R

from .numerics import exact_8bit

ops = torch.ops.qbackend


def _rows(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    flat = x.reshape(-1, shape[-1])
    if flat.shape[0] >= 8 and shape[-1] >= 4:
        flat[0] = 0.0                       # all zero: scale 1, zero point 0
        flat[1, 2] = float("nan")           # NaN -> its row's zero point
        flat[2, 1], flat[2, 3] = float("inf"), float("-inf")
        flat[3] = float("nan")              # nothing finite: scale 1, zero point 0
        flat[4] = flat[4].abs() + 1.0       # positive only: zero point 0
        flat[5] = -flat[5].abs() - 1.0      # negative only: zero point qmax
        flat[6] = 2.5                       # constant
        flat[7, 0] = 1e6                    # one outlier
    return x


@pytest.mark.parametrize("qmax", [255, 127])
@pytest.mark.parametrize("shape", [(1,), (9,), (8, 5), (16, 333), (3, 11, 64), (2, 4, 1536)])
def test_quantize_per_row_is_the_reference(shape, qmax):
    x = _rows(shape, seed=len(shape) * 100 + shape[-1])
    q, scale, zp = ops.quantize_per_row(x, qmax)
    rq, rscale, rzp = R.quantize_per_row(x, qmax)
    assert q.dtype == torch.uint8 and scale.dtype == torch.float32 and zp.dtype == torch.int32
    assert q.shape == x.shape and scale.shape == x.shape[:-1] and zp.shape == x.shape[:-1]
    assert torch.equal(q, rq) and torch.equal(scale, rscale) and torch.equal(zp, rzp)
    assert int(q.max()) <= qmax


@pytest.mark.parametrize("qmax", [255, 127])
def test_per_row_qparams_are_choose_qparams_of_each_rows_range(qmax):
    x = torch.randn(12, 40, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 3, 12)[:, None]
    x[4] = x[4].abs()
    _, scale, zp = ops.quantize_per_row(x, qmax)
    for r in range(x.shape[0]):
        qp = choose_qparams(float(x[r].min()), float(x[r].max()), torch.uint8, qmin=0, qmax=qmax)
        assert float(scale[r]) == qp.scale and int(zp[r]) == qp.zero_point


def test_quantize_per_row_round_trip_error_is_at_most_half_a_step():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(4)) * torch.logspace(-2, 2, 64)[:, None]
    q, scale, zp = ops.quantize_per_row(x, 255)
    back = (q.double() - zp.double()[:, None]) * scale.double()[:, None]
    assert bool(((back - x.double()).abs() <= scale.double()[:, None] / 2 * (1 + 1e-6)).all())


def test_quantize_per_row_reads_strided_input():
    x = torch.randn(10, 30, generator=torch.Generator().manual_seed(5))
    xt = x.t()  # not contiguous
    assert all(torch.equal(a, b) for a, b in zip(ops.quantize_per_row(xt, 255), R.quantize_per_row(xt.contiguous(), 255)))


@pytest.mark.parametrize("bias", [True, False])
def test_per_row_dequantize_is_the_reference(bias):
    g = torch.Generator().manual_seed(6)
    acc = torch.randn(3, 7, 50, generator=g) * 1000
    scale, zp = torch.rand(3, 7, generator=g), torch.randint(0, 256, (3, 7), generator=g, dtype=torch.int32)
    colsum, b = torch.randn(50, generator=g) * 30, torch.randn(50, generator=g) if bias else None
    assert torch.equal(ops.per_row_dequantize(acc, scale, zp, colsum, b), R.per_row_dequantize(acc, scale, zp, colsum, b))


def test_bad_inputs_are_clear_errors():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x must be float32"):
        ops.quantize_per_row(x.double(), 255)
    with pytest.raises(ValueError, match="qmax must be 255 or 127"):
        ops.quantize_per_row(x, 200)
    with pytest.raises(ValueError, match="at least one dimension"):
        ops.quantize_per_row(torch.tensor(1.0), 255)
    acc, s, z, c = torch.randn(4, 6), torch.rand(4), torch.zeros(4, dtype=torch.int32), torch.randn(6)
    with pytest.raises(ValueError, match="one entry per row"):
        ops.per_row_dequantize(acc, s[:3], z, c)
    with pytest.raises(ValueError, match="colsum must be 1-D of length"):
        ops.per_row_dequantize(acc, s, z, c[:5])
    with pytest.raises(TypeError, match="zero_point must be int32"):
        ops.per_row_dequantize(acc, s, z.long(), c)
    with pytest.raises(ValueError, match="bias must be 1-D"):
        ops.per_row_dequantize(acc, s, z, c, torch.randn(5))


def test_fake_impls_pass_opcheck():
    x = torch.randn(3, 5, 40)
    opcheck(ops.quantize_per_row.default, (x, 255))
    acc, s, z = torch.randn(6, 12), torch.rand(6), torch.randint(0, 256, (6,), dtype=torch.int32)
    opcheck(ops.per_row_dequantize.default, (acc, s, z, torch.randn(12), torch.randn(12)))


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    scales = w.abs().amax(dim=1) / 127
    return torch.round(w / scales[:, None]).to(torch.int8), scales, torch.randn(n, generator=g)


@pytest.mark.parametrize("post_op", ["none", "relu", "gelu"])
@pytest.mark.parametrize("provider", ["fbgemm", "onednn", "native"])
def test_token_linear_matches_fp64_on_the_same_integers(provider, post_op):
    if provider == "native" and not _C.native_isa():
        pytest.skip("no native GEMM on this ISA")
    qmax = 255 if exact_8bit(provider) else 127
    wq, ws, bias = _weights(48, 200, seed=7)
    x = torch.randn(2, 13, 200, generator=torch.Generator().manual_seed(8))
    x[0, 3] *= 100  # an outlier token keeps its own range
    m = TokenQuantizedLinear(PackedLinearWeight(wq, ws, None, provider=provider), bias, qmax, post_op)
    y = m(x)
    ref = R.token_linear_fp64(x, wq, ws, bias, qmax, post_op)
    assert y.shape == (2, 13, 48) and y.dtype == torch.float32
    # fp32 roundings only: the GEMM's int32 sum times the weight scale, the zero point's product,
    # the difference and the row scale (a few ulps of the row's largest partial sums)
    tol = 1e-5 * (ref.abs().amax(dim=-1, keepdim=True) + x.abs().amax(dim=-1, keepdim=True) * 10) + 1e-6
    assert bool(((y.double() - ref).abs() <= tol).all()), f"max diff {(y.double() - ref).abs().max()}"


def test_token_linear_refuses_bad_construction_and_input():
    wq, ws, bias = _weights(8, 16, seed=9)
    with pytest.raises(ValueError, match="without it"):
        TokenQuantizedLinear(PackedLinearWeight(wq, ws, bias, provider="fbgemm"), bias)
    packed = PackedLinearWeight(wq, ws, None, provider="fbgemm")
    with pytest.raises(ValueError, match="qmax must be 255 or 127"):
        TokenQuantizedLinear(packed, bias, qmax=128)
    with pytest.raises(ValueError, match="not relu6"):
        TokenQuantizedLinear(packed, bias, post_op="relu6")
    with pytest.raises(TypeError, match="float32 input"):
        TokenQuantizedLinear(packed, bias)(torch.randn(3, 16, dtype=torch.float64))
