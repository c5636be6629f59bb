"""qbackend.demo: the digits CNN trained, quantized and measured (small options; the CLI test runs it
in a child process)."""
import json

import pytest
import torch

from qbackend.cli import demo


@pytest.fixture(scope="module")
def result():
    return demo.run_demo(batch_sizes=(1, 4), rounds=3, epochs=2)


def test_result_fields(result):
    assert set(result["top1_percent"]) == {"fp32", "int8"}
    for v in result["top1_percent"].values():
        assert 0.0 <= v <= 100.0
    # two epochs already learn the digits well above chance (10%); int8 stays close to fp32
    assert result["top1_percent"]["fp32"] > 50
    assert abs(result["top1_percent"]["int8"] - result["top1_percent"]["fp32"]) < 5
    assert [row["batch"] for row in result["latency"]] == [1, 4]
    for row in result["latency"]:
        assert row["fp32_ms"] > 0 and row["int8_ms"] > 0 and row["rounds"] == 3
        assert row["speedup"] == pytest.approx(row["fp32_ms"] / row["int8_ms"])
    size = result["size"]
    assert 0 < size["int8_saved_bytes"] < size["fp32_state_dict_bytes"]
    assert [l["layer"] for l in result["layers"]] == ["conv1", "conv2", "fc"]
    assert {l["provider"] for l in result["layers"]} <= {"native", "fbgemm", "onednn"}
    assert result["data"] == {"train": 1077, "calibration": 180, "test": 540}
    json.dumps(result)  # --json writes it as is


def test_format(result):
    text = demo.format_demo(result)
    lines = text.splitlines()
    assert "| | FP32 | INT8 | INT8 vs FP32 |" in lines
    assert any(l.startswith("| test top-1 (%) |") and "points |" in l for l in lines)
    assert sum(l.startswith("| latency, batch ") for l in lines) == 2
    assert any(l.startswith("| model size (bytes) |") and "smaller" in l for l in lines)
    assert sum(l.strip().startswith(("conv1 ", "conv2 ", "fc ")) for l in lines) == 3
    assert "rule [" in text and "kernel-facts" not in text  # each layer's rule, not its long reason


def test_ratio_wording():
    r = {"model": "m", "machine": {"cpu": "c", "isa_class": "avx2", "threads": 1, "torch": "t", "qbackend": "q"},
         "data": {"train": 1, "calibration": 1, "test": 1}, "train_seconds": 1.0, "quantize_seconds": 1.0,
         "top1_percent": {"fp32": 90.0, "int8": 89.5},
         "latency": [{"batch": 1, "fp32_ms": 1.0, "int8_ms": 2.0, "speedup": 0.5, "rounds": 5},
                     {"batch": 8, "fp32_ms": 3.0, "int8_ms": 1.0, "speedup": 3.0, "rounds": 5}],
         "size": {"fp32_state_dict_bytes": 4000, "int8_saved_bytes": 1000}, "layers": [], "total_seconds": 3.0}
    text = demo.format_demo(r)
    assert "| latency, batch 1 (ms) | 1.000 | 2.000 | 2.00x slower |" in text
    assert "| latency, batch 8 (ms) | 3.000 | 1.000 | 3.00x faster |" in text
    assert "| test top-1 (%) | 90.00 | 89.50 | -0.50 points |" in text
    assert "4.00x smaller" in text and "1 thread," in text


def test_timing_is_interleaved_and_bounded():
    calls = []

    class M(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, x):
            calls.append(self.name)
            return x

    ms, rounds = demo._interleaved_median_ms({"a": M("a"), "b": M("b")}, torch.zeros(1), rounds=4, block_s=1e-9)
    assert rounds == 4 and set(ms) == {"a", "b"}
    timed = calls[16:]  # after 3 warm-up + 5 estimate calls per model; 1 call per block
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a"]
    ms, rounds = demo._interleaved_median_ms({"a": M("a")}, torch.zeros(1), rounds=10**6, budget_s=0.0)
    assert rounds == 5  # stops after the minimum once the budget is spent


@pytest.mark.parametrize("kwargs, text", [({"batch_sizes": ()}, "batch sizes"), ({"batch_sizes": (0,)}, "batch sizes"),
                                          ({"rounds": 0}, "rounds"), ({"threads": 0}, "threads")])
def test_bad_arguments(kwargs, text):
    with pytest.raises(ValueError, match=text):
        demo.run_demo(**kwargs)
