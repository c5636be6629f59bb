"""qbackend.report.plan_profile: each forward-plan step timed by the replay and attributed to the
layer that ran it; the sums are consistent with the replay; bad arguments raise clear errors."""
from __future__ import annotations

import pytest
import torch

import qbackend
from qbackend.models import MODELS
from qbackend.report.plan_profile import profile_plan


@pytest.fixture(scope="module")
def digits():
    case = MODELS["digits_cnn"](batch_size=8)
    q = qbackend.quantize(case.model.eval(), case.example_inputs, case.calibration)
    return q, case.calibration[0][0][:2]


def test_steps_are_the_plan_attributed_to_layers(digits):
    q, x = digits
    prof = profile_plan(q, x, repeats=20)
    with torch.no_grad():
        plan, _ = q.recorded_plan(x)
    assert [s.op for s in prof.steps] == plan.step_names
    assert [s.layer for s in prof.steps if s.layer] == ["conv1", "conv2", "fc"]
    for s in prof.steps:
        assert 0 < s.min_us <= s.median_us
        if s.layer is None:  # quantize, pooling, views: run by the graph or a non-layer module
            assert "conv2d" not in s.op and "linear" not in s.op
    # each replay's steps sum to at most its own total, so their minima do too
    assert 0 < prof.steps_sum_us[0] <= prof.replay_us[0]
    assert prof.forward_us[0] > 0
    assert all(0 <= v for v in prof.loop_us) and all(0 < v for v in prof.entry_us)
    assert prof.entry_us[0] < prof.forward_us[0]  # the call contains its replay
    for stat in range(3):
        assert prof.overhead_per_step_us(stat) == pytest.approx(
            (prof.entry_us[stat] + prof.loop_us[stat]) / len(prof.steps))
    assert all(s.min_us <= s.mean_us for s in prof.steps)


def test_outputs_unchanged_by_timing(digits):
    q, x = digits
    with torch.no_grad():
        q(x), q(x)
        plan, tensors = q.recorded_plan(x)
        out, ns = plan.run_timed(tensors)
        assert len(ns) == len(plan.step_names) + 1 and all(v >= 0 for v in ns)
        q.forward_plans = False
        ref = q(x)
        q.forward_plans = True
    assert torch.equal(out[0], ref)


def test_bad_arguments(digits):
    q, x = digits
    with pytest.raises(TypeError, match="qmodel"):
        profile_plan(torch.nn.Linear(2, 2), x)
    with pytest.raises(ValueError, match="repeats"):
        profile_plan(q, x, repeats=0)
    q.forward_plans = False
    try:
        with pytest.raises(ValueError, match="no forward plan.*forward plans are off"):
            profile_plan(q, x)
    finally:
        q.forward_plans = True
