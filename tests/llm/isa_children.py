"""Runs a weight-only op on cases in child processes capped to each ISA this CPU has (scalar, AVX2,
and uncapped), for the kernels' tests: {isa: the outputs}; each child says which kernel table it
used (`isa_fn`, a qbackend._C function naming it). And, for kernels chosen per call, the caps in this
process that select each of them (`decoding_attention_caps`, `isa_capped`)."""
from __future__ import annotations

import contextlib
import os
import sys

import torch

import qbackend
from qbackend.core.isa import requested as requested_isa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from subprocess_utils import run_py  # noqa: E402

CHILD = """
import torch, qbackend
qbackend._C.set_isa_cap({level})
cases = torch.load({inp!r})
torch.save({{"isa": qbackend._C.{isa_fn}(), "out": [torch.ops.qbackend.{op}(*c) for c in cases]}}, {outp!r})
"""


def outputs_on_every_isa(tmp_path, op: str, cases: list, isa_fn: str = "woq_isa", top: str = "avx512",
                         top_level: int = 2) -> dict:
    """`top`: the name of the kernel table used uncapped where the CPU reaches `top_level` (an Isa value)."""
    inp = str(tmp_path / "in.pt")
    torch.save(cases, inp)
    levels = {"scalar": 0, "avx2": 1}
    if int(qbackend._C.usable_isa()) >= top_level:
        levels[top] = -1
    results = {}
    for isa, level in levels.items():
        outp = str(tmp_path / f"{isa}.pt")
        run_py(CHILD.format(level=level, inp=inp, outp=outp, op=op, isa_fn=isa_fn), check=True)
        res = torch.load(outp)
        assert res["isa"] == isa
        results[isa] = res["out"]
    return results


def with_awkward_rows(x: torch.Tensor) -> torch.Tensor:
    """x [M >= 8, K >= 32] with rows that stress an activation quantizer by blocks of 32: an all-zero block
    (row 3), values near ties at half a level (4), exact levels and halves across the row (5), a NaN (6)
    and an infinity (7). In place; returns x."""
    k = x.shape[1]
    x[3, :32] = 0
    x[4, :32] = torch.arange(32) - 15.5
    x[5, :k] = torch.linspace(-1, 1, k) * 127
    x[6, 7] = float("nan")
    x[7, k - 1] = float("-inf")
    return x


def assert_equal_on_every_isa(outputs: dict) -> None:
    """The outputs of every ISA (outputs_on_every_isa) equal bit for bit, NaNs in the same places."""
    first = next(iter(outputs.values()))
    for isa, ys in outputs.items():
        for y, y0 in zip(ys, first):
            assert torch.equal(y.isnan(), y0.isnan()) and torch.equal(y.nan_to_num(), y0.nan_to_num()), isa


def decoding_attention_caps() -> dict:
    """{the decoding attention kernel's name: the ISA cap that selects it}: this CPU's kernel under the
    process's own cap, and the AVX2 kernel too where the CPU has AVX512 ('' where it has neither: SDPA)."""
    from qbackend.core.isa import Isa
    from qbackend.dispatch.cpu import cpu_features

    level = cpu_features().level
    caps = {"avx512" if level >= Isa.AVX512 else "avx2" if level >= Isa.AVX2 else "": qbackend._C.isa_cap()}
    if level >= Isa.AVX512:
        caps["avx2"] = int(Isa.AVX2)
    return caps


@contextlib.contextmanager
def isa_capped(cap: int):
    """qbackend's own kernels capped at `cap` (an Isa value; -1: none) in this process, the cap restored after."""
    before = qbackend._C.isa_cap()
    vnni = requested_isa() not in ("avx2", "avx512")  # what apply_cap allowed at import
    qbackend._C.set_isa_cap(cap, vnni)
    try:
        yield
    finally:
        qbackend._C.set_isa_cap(before, vnni)
