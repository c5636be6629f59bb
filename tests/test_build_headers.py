"""The C++ sources keep the build fast: no translation unit includes torch's umbrella headers
(ATen/ATen.h, torch/extension.h, torch/all.h), which cost 14-50 s of parsing per unit on a CI core;
each includes the ATen/ops/<op>.h headers of the functions it calls."""
from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
UMBRELLAS = ("ATen/ATen.h", "torch/extension.h", "torch/all.h", "torch/torch.h", "ATen/Functions.h")


def _sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cpp", ".h"))


def test_no_umbrella_headers():
    found = [f"{p.relative_to(CSRC)}: {h}" for p in _sources() for h in UMBRELLAS
             if f"#include <{h}>" in p.read_text()]
    assert not found, found


def test_each_aten_function_called_has_its_header():
    """A call at::op(...) in a .cpp needs ATen/ops/op.h in that file or in a csrc header it includes
    (ATen/core/Tensor.h declares only the methods)."""
    texts = {p: p.read_text() for p in _sources()}
    declared_elsewhere = {"parallel_for", "get_num_threads", "in_parallel_region", "dtype", "get_overlap_status"}
    missing = []
    for p, text in texts.items():
        if p.suffix != ".cpp":
            continue
        included = text + "".join(texts.get(CSRC / inc, "") for inc in re.findall(r'#include "([^"]+)"', text))
        for op in sorted(set(re.findall(r"\bat::([a-z_0-9]+)\(", text)) - declared_elsewhere):
            if f"#include <ATen/ops/{op}.h>" not in included and f"#include <ATen/{op}" not in included:
                missing.append(f"{p.relative_to(CSRC)}: at::{op}")
    assert not missing, missing
