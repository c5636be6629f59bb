"""The model-level fuzzer in CI (tests/fuzz/model_cases.py): a fixed set of seeded random CNNs,
MLPs and encoders quantized with qbackend.quantize, each at least its class's SQNR floor against
FP32 and bit-identical after qbackend.save / qbackend.load; torch.compile against eager in the slow
sweep (it costs a minute to warm up). tools/fuzz_models.py runs thousands."""
from __future__ import annotations

import pytest

from tests.fuzz.model_cases import check_model

pytestmark = pytest.mark.usefixtures("one_thread")

CI_SEEDS = range(9)  # three of each class


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_random_model_quantizes_accurately_and_round_trips(seed):
    rec = check_model(seed)
    assert not rec["failures"], rec


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1000, 1060))
def test_random_model_sweep_with_compile(seed):
    rec = check_model(seed, compile_=seed % 10 == 0)
    assert not rec["failures"], rec
