"""GPTQ rounding of the decoder LLMs' 4-bit weights (qbackend.llm.gptq, quantize_llm(calibration=...)):
on a layer whose inputs are correlated, the output error ||X W^T - X Q^T||^2 (fp64, the same X the
statistics came from) is lower than nearest rounding's for every group size and both grids; the
levels and grids are valid 4-bit groups; unusable statistics keep nearest rounding; quantize_llm runs
the float model on the calibration ids once and lowers the logits' error; bad calibration input is an
error naming it."""
from __future__ import annotations

import pytest
import torch

import qbackend
from qbackend.llm.gptq import calibration_batches, gptq_int4
from qbackend.nn.int4_linear import GROUP_SIZES, dequantize_int4, quantize_int4

from .test_quantize_llm import _ids, _llama, _sqnr


def _layer(n=24, k=256, rows=512, seed=0):
    """A weight [n, k] and inputs [rows, k] with correlated columns and a few loud ones."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(rows, k // 4, generator=g) @ torch.randn(k // 4, k, generator=g)
    x[:, :5] *= 8
    return w, x


def _output_error(x, w, packed, scales, offsets, g):
    wq = dequantize_int4(packed, scales, offsets, g, w.shape[1]).double()
    return float((x.double() @ (w.double() - wq).T).pow(2).sum())


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("g", GROUP_SIZES)
def test_lower_output_error_than_nearest(g, symmetric):
    w, x = _layer(seed=g)
    (packed, scales, offsets), rounded = gptq_int4(w, x.T @ x, g, symmetric)
    nearest = quantize_int4(w, g, symmetric)
    assert rounded
    assert packed.shape == nearest[0].shape and scales.shape == offsets.shape == nearest[1].shape
    err, err_nearest = _output_error(x, w, packed, scales, offsets, g), _output_error(x, w, *nearest, g)
    assert err < 0.8 * err_nearest, (err, err_nearest)
    u = torch.stack([packed & 15, packed >> 4], dim=2).reshape(w.shape[0], -1)
    assert int(u.max()) <= 15 and bool((scales > 0).all())
    if symmetric:
        torch.testing.assert_close(offsets, -8 * scales, rtol=0, atol=0)


def test_unusable_statistics_keep_nearest_rounding():
    w, _ = _layer()
    for h in (torch.zeros(256, 256), torch.full((256, 256), float("nan"))):
        result, rounded = gptq_int4(w, h, 32, False)
        assert not rounded
        for a, b in zip(result, quantize_int4(w, 32, False)):
            assert torch.equal(a, b)


def test_quantize_llm_with_calibration():
    ids = _ids(n=4, t=32, seed=3)
    ref_model = _llama()
    with torch.no_grad():
        ref = ref_model(ids).logits
    nearest = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(weights="int4", group_size=32))
    gptq = qbackend.quantize_llm(_llama(), qbackend.LLMConfig(weights="int4", group_size=32),
                                 calibration=[ids[:2], ids[2:]])
    assert len(gptq.qbackend_llm["gptq"]) >= 10 and nearest.qbackend_llm["gptq"] == []
    assert "lm_head" not in gptq.qbackend_llm["gptq"]  # the output projection stays int8
    with torch.no_grad():
        assert _sqnr(ref, gptq(ids).logits) > _sqnr(ref, nearest(ids).logits)
    gptq.generate(ids[:1, :8], max_new_tokens=3, do_sample=False)


def test_bad_calibration_names_itself():
    with pytest.raises(ValueError, match="calibration batch 1 must be a non-empty int64 tensor"):
        calibration_batches([torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="at least one batch"):
        calibration_batches([])
    with pytest.raises(ValueError, match="calibration sets GPTQ's rounding of 4-bit weights"):
        qbackend.quantize_llm(_llama(), qbackend.LLMConfig(), calibration=_ids())
