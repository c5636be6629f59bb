"""`qbackend llm` (a causal LM quantized in place, generated from, measured against FP32) on a
random-init Llama built from a config, its argument errors, and examples/llm_generate.py run as a
user would."""
from __future__ import annotations

import math
import re

import pytest

from qbackend.cli import main
from tests.subprocess_utils import run_example

pytest.importorskip("transformers")


@pytest.mark.parametrize("args,embedding", [([], "float"),
                                            (["--weights", "int4", "--group-size", "32", "--activations", "int8",
                                              "--embedding", "int8"], "int8")])
def test_llm_command_on_a_random_llama(capsys, args, embedding):
    assert main(["llm", "--random", "--new-tokens", "4", "--threads", "1", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"quantized 29 Linears \((int8|int4) weights, (float|int8) activations\) in [\d.]+ s; "
                    rf"4 native decoder layers, 8 fused groups; input embedding {embedding}$", out[0]), out[0]
    rows = {line.split()[0]: line.split() for line in out[1:3]}
    assert set(rows) == {"FP32", "qbackend"}
    for r in rows.values():  # name, tokens/s, "tokens/s", "perplexity", value
        assert float(r[1]) > 0 and math.isfinite(float(r[4]))
    # a random model's perplexity is near its vocabulary size; the quantized one stays close to FP32's
    assert abs(float(rows["qbackend"][4]) / float(rows["FP32"][4]) - 1) < 0.05


@pytest.mark.parametrize("args,message", [(["--new-tokens", "1"], "--new-tokens must be at least 2"),
                                          (["--group-size", "32"], "--group-size applies to --weights int4"),
                                          (["--threads", "0"], "--threads must be at least 1")])
def test_llm_command_bad_arguments(capsys, args, message):
    assert main(["llm", "--random", *args]) == 2
    assert message in capsys.readouterr().err


def test_llm_generate_example_runs():
    proc = run_example("llm_generate.py", timeout=600)
    lines = proc.stdout.splitlines()
    assert re.match(r"native decoder layers: (4|30)$", lines[0]), lines[0]
    for name in ("FP32", "W4A8"):
        assert any(re.match(rf"{name}: [\d.]+ tokens/s, perplexity [\d.]+$", line) for line in lines), name
