"""8-bit models loaded under QBACKEND_ISA=avx2 keep their 8-bit activations (the native AVX2 GEMM
runs Linear and dense convs exactly, oneDNN the depthwise ones): output SQNR against FP32 within
0.5 dB of the same file loaded on this CPU's ISA, and above the 7-bit load's where that loses
levels. benchmarks/avx2_exact_sqnr.py does the work (quantize here, save, load in child processes).
All slow-marked (40 s of CPU for the 32x32 ResNet-18, minutes for the full-size ones); CI's fast
variant is tests/test_serialization.py::test_load_on_another_isa (a small residual CNN, the same
0.5 dB bound)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from qbackend.core.extension import _C

pytestmark = pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")


def _benchmark():
    """benchmarks/avx2_exact_sqnr.py, imported when a test runs and with benchmarks/ taken off
    sys.path again, so that the benchmark scripts' module names never shadow installed packages
    for the rest of the test session (collecting this file must not import it either)."""
    here = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, here)
    try:
        return importlib.import_module("avx2_exact_sqnr")
    finally:
        sys.path[:] = [p for p in sys.path if p != here]


def check(f: dict) -> None:
    here, avx2 = f["here"], f["avx2"]
    assert avx2["native"] == "avx2" and avx2["uint8_8bit"] == here["uint8_8bit"] > 0 and not avx2["warnings"]
    assert avx2["providers"].get("native", 0) > 0
    assert abs(avx2["sqnr"] - here["sqnr"]) <= 0.5, f
    if "avx2 7-bit" in f:
        assert f["avx2 7-bit"]["uint8_8bit"] == 0


@pytest.mark.slow
def test_small_resnet18_keeps_8_bits_under_avx2():
    """Two child processes (this CPU's ISA, avx2) on a 32x32 ResNet-18."""
    b = _benchmark()
    f = b.figures("resnet18", b.QUICK["resnet18"], loads=b.LOADS[:2])
    check(f)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_base"])
def test_zoo_models_keep_8_bits_under_avx2(name):
    b = _benchmark()
    f = b.figures(name, b.SIZES[name])
    check(f)
    assert f["avx2"]["sqnr"] > f["avx2 7-bit"]["sqnr"], f
