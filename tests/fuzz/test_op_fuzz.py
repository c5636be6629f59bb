"""The op-level differential fuzzer in CI (tests/fuzz/op_cases.py): every op family on every
provider, 150 derandomized hypothesis examples per family, split over its providers (the slow
sweep: 3000 per provider), none wrong. A case
the router never sends to a provider (Provider.refuses) passes as refused; a clear error (one
naming an argument) passes. Run under QBACKEND_ISA=avx2 / avx512_vnni by .ci/run too, where the
native provider refuses everything and 8-bit-saturating providers get 7-bit activations.
tools/fuzz_ops.py runs the same cases for hours, with crashes caught in child processes."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.draw import HypothesisDraw
from tests.fuzz.op_cases import FAMILIES, draw_case, run_case

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [(f, p) for f, ps in FAMILIES.items() for p in ps]
PER_FAMILY = 150
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
SLOW_SET = settings(max_examples=3000, deadline=None, suppress_health_check=_HEALTH)


def _check(family, provider, data):
    case = draw_case(HypothesisDraw(data), family, provider)
    outcome, detail = run_case(case)
    assert outcome != "wrong", f"{family} on {provider}: {detail}\ncase: {case}"


@pytest.mark.parametrize("family,provider", PAIRS)
def test_op_matches_fp64_reference(family, provider):
    examples = PER_FAMILY // len(FAMILIES[family])

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=_HEALTH)
    @given(data=st.data())
    def run(data):
        _check(family, provider, data)
    run()


@pytest.mark.slow
@pytest.mark.parametrize("family,provider", PAIRS)
@SLOW_SET
@given(data=st.data())
def test_op_matches_fp64_reference_sweep(family, provider, data):
    _check(family, provider, data)
