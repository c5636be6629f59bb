"""Distributed calibration (qbackend.reduce_calibration) on 2 and 3 gloo ranks on 127.0.0.1: the
converted model is bit-identical, on every rank, to one process calibrated on all the ranks'
batches; failures name the rank."""
from __future__ import annotations

import torch
import pytest

from .launcher import failures, read_json, run_ranks


def _load(path):
    return torch.load(path, weights_only=True)


def _assert_same_model(got: dict, ref: dict, where: str) -> None:
    assert got["meta"] == ref["meta"], f"{where}: the model's document (scales, zero points, layers) differs"
    assert got["tensors"].keys() == ref["tensors"].keys(), where
    for k, t in ref["tensors"].items():
        assert torch.equal(got["tensors"][k], t), f"{where}: tensor {k} differs"
    for a, b in zip(got["outputs"], ref["outputs"]):
        assert torch.equal(a, b), f"{where}: outputs differ"


def _check_equal(out, model, world, kinds=None):
    for kind in kinds or [None]:
        tag = f"{model}_{kind or 'default'}"
        ref = _load(out / f"{tag}_reference.pt")
        for r in range(world):
            _assert_same_model(_load(out / f"{tag}_rank{r}.pt"), ref, f"{tag} rank {r}")


@pytest.mark.parametrize("model,shards", [
    ("cnn", [[0, 1, 2], [3], [4, 5]]),
    ("encoder", [[0, 1, 2, 3], [4]]),
    ("dlrm", [[0], [1, 2, 3], [4, 5]]),
    ("branchy", [[0, 1], [2, 3, 4, 5]]),
])
def test_reduced_calibration_gives_one_process_model(tmp_path, model, shards):
    codes = run_ranks("equal_to_one_process", len(shards), str(tmp_path), model=model, shards=shards)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    _check_equal(tmp_path, model, len(shards))
    info = read_json(tmp_path, f"{model}_default_rank0.json")
    if model == "encoder":  # SmoothQuant's statistics and GPTQ's Hessians took part
        assert info["smoothed_values"] > 0 and info["hessians"] > 0 and info["bytes_summed"] > 0
    if model == "branchy":
        assert info["method"] == "module_swap"


def test_every_exact_observer_kind_and_a_rank_without_data(tmp_path):
    kinds = ["minmax", "histogram", "percentile", "mse", "best_range"]
    shards = [[0, 1], [], [2, 3, 4]]
    codes = run_ranks("equal_to_one_process", 3, str(tmp_path), model="convmlp", shards=shards, kinds=kinds)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    _check_equal(tmp_path, "convmlp", 3, kinds)
    for r in range(3):
        info = read_json(tmp_path, f"convmlp_minmax_rank{r}.json")
        assert info["ranks_without_data"] == [1]
        assert any("rank(s) 1 calibrated on no data" in w for w in info["warnings"]), info


def test_one_call_quantize_with_distributed_calibration(tmp_path):
    shards = [[0, 1, 2], []]
    codes = run_ranks("one_call", 2, str(tmp_path), shards=shards)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    _check_equal(tmp_path, "quantize", 2)


def test_a_rank_killed_mid_calibration_is_named(tmp_path):
    codes = run_ranks("killed_rank", 3, str(tmp_path), victim=1)
    assert codes[1] == 17, codes
    for r in (0, 2):
        rec = read_json(tmp_path, f"rank{r}.json")
        assert rec["error"] == "DistributedCalibrationError", rec
        assert "rank(s) 1 did not reach the calibration reduction" in rec["message"], rec
        assert rec["seconds"] < 60, rec  # the closed connection is seen at once, not at the timeout


def test_a_rank_that_does_not_arrive_in_time_is_named(tmp_path):
    codes = run_ranks("late_rank", 3, str(tmp_path), late=1, delay=12.0, wait=3.0)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    for r in (0, 2):
        rec = read_json(tmp_path, f"rank{r}.json")
        assert rec["error"] == "DistributedCalibrationError", rec
        assert "rank(s) 1 did not reach the calibration reduction (within 0:00:03" in rec["message"], rec
        assert rec["seconds"] < 10, rec  # the timeout given, not the process group's
    late = read_json(tmp_path, "rank1.json")  # the others are gone by the time it arrives
    assert late["error"] == "DistributedCalibrationError" and "rank(s) 0, 2 did not reach" in late["message"], late


@pytest.mark.parametrize("what,label", [("weights", "weights"), ("config", "configuration"),
                                        ("model", "model (graph and parameter shapes)")])
def test_a_rank_with_another_model_is_named_before_anything_moves(tmp_path, what, label):
    codes = run_ranks("mismatched", 2, str(tmp_path), what=what, odd=1)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    for r in (0, 1):
        rec = read_json(tmp_path, f"rank{r}.json")
        assert rec["error"] == "DistributedCalibrationError", rec
        assert "rank 1's" in rec["message"] and label in rec["message"], rec


def test_an_order_dependent_observer_is_refused_on_every_rank(tmp_path):
    codes = run_ranks("order_dependent_observer", 2, str(tmp_path))
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    for r in (0, 1):
        rec = read_json(tmp_path, f"rank{r}.json")
        assert rec["error"] == "ValueError" and "MovingAverageMinMaxObserver" in rec["message"], rec


def test_causal_lm_gptq_statistics_reduced_across_ranks(tmp_path):
    shards = [[0, 1, 2], [], [3, 4, 5]]
    codes = run_ranks("llm_equal_to_one_process", 3, str(tmp_path), shards=shards)
    assert all(c == 0 for c in codes.values()), failures(str(tmp_path), codes)
    _check_equal(tmp_path, "llm", 3)
