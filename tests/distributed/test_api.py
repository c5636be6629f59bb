"""qbackend.reduce_calibration's contract in one process: argument errors name the argument, a
group of one rank leaves the statistics as they were, and a second reduction is refused."""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import qbackend
from qbackend.observers import ObserverError
from qbackend.serialization.model_file import model_parts

from .scenarios import _batch, _seeded_model


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _calibrated(name="encoder"):
    prepared = qbackend.prepare(_seeded_model(name), _batch(name, 0))
    qbackend.calibrate(prepared, [_batch(name, i) for i in range(3)])
    return prepared


def test_without_a_process_group_the_error_says_what_to_do():
    prepared = _calibrated("convmlp")
    with pytest.raises(qbackend.DistributedCalibrationError, match="init_process_group"):
        qbackend.reduce_calibration(prepared)
    assert prepared.reduction is None


def test_arguments_are_checked(one_rank_group):
    with pytest.raises(TypeError, match="qbackend.prepare returned"):
        qbackend.reduce_calibration(_seeded_model("convmlp"))
    with pytest.raises(TypeError, match="timeout must be a datetime.timedelta"):
        qbackend.reduce_calibration(_calibrated("convmlp"), timeout=30)
    model, x = _seeded_model("convmlp"), _batch("convmlp", 0)
    with pytest.raises(ValueError, match="does not combine with the accuracy-budgeted fallback"):
        qbackend.quantize(model, x, [x], eval_fn=lambda m: 0.0, max_drop=1.0, distributed=True)
    with pytest.raises(ValueError, match="has none"):
        qbackend.quantize(model, x, [x], config=qbackend.QuantConfig(mode="dynamic"), distributed=True)
    with pytest.raises(ValueError, match="distributed=True reduces GPTQ"):
        from tests.llm.test_quantize_llm import _llama
        qbackend.quantize_llm(_llama(), qbackend.LLMConfig(weights="int4"), distributed=True)


def test_one_rank_keeps_its_statistics_and_a_second_reduction_is_refused(one_rank_group):
    alone, reduced = _calibrated(), _calibrated()
    report = qbackend.reduce_calibration(reduced, timeout=datetime.timedelta(seconds=30))
    assert reduced.reduction is report and report.ranks == 1 and report.ranks_without_data == []
    assert report.statistics == len(reduced._prepared.statistics()) > 0 and report.bytes_summed > 0
    a, b = model_parts(qbackend.convert(alone)), model_parts(qbackend.convert(reduced))
    assert a[1] == b[1] and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    with pytest.raises(ValueError, match="already reduced"):
        qbackend.reduce_calibration(reduced)


def test_statistics_cover_every_recorder_convert_reads():
    prepared = _calibrated()
    kinds = {type(h).__name__ for _, h in prepared._prepared.statistics()}
    assert {"BestRangeObserver", "ChannelStats", "HessianStats"} <= kinds
    names = [n for n, _ in prepared._prepared.statistics()]
    assert len(names) == len(set(names))


def test_a_reduction_that_fails_midway_leaves_the_model_unconvertible(one_rank_group, monkeypatch):
    from qbackend.distributed import PartialReductionError
    from qbackend.distributed import statistics

    prepared = _calibrated("convmlp")
    calls = []
    real = statistics.apply

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a malformed state")
        return real(*args)

    monkeypatch.setattr(statistics, "apply", failing)
    with pytest.raises(PartialReductionError, match="partly reduced .*a malformed state"):
        qbackend.reduce_calibration(prepared)
    with pytest.raises(ValueError, match="statistics are unusable"):
        qbackend.convert(prepared)
    with pytest.raises(ValueError, match="statistics are unusable"):
        qbackend.reduce_calibration(prepared)


def test_no_data_on_every_rank_is_left_to_convert_to_report(one_rank_group):
    import warnings

    prepared = qbackend.prepare(_seeded_model("convmlp"), _batch("convmlp", 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", qbackend.RankWithoutDataWarning)  # not "the others' data": there is none
        report = qbackend.reduce_calibration(prepared)
    assert report.ranks_without_data == [0]
    with pytest.raises(ObserverError, match="no finite|no data|saw no"):
        qbackend.convert(prepared)
