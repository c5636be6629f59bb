"""qbackend's own thread pool (csrc/runtime/parallel.cpp), which runs the kernels' parallel loops when
torch's OpenMP threads sleep between regions (QBACKEND_THREADING, OMP_WAIT_POLICY).

Through the test hook `_C.parallel_probe`: every index of [0, n) is visited exactly once for any
n and grain, a second thread takes chunks when they are long, an exception in a chunk reaches the
caller and leaves the pool usable, a loop nested in a region runs serially; the ops give bit-identical
results on this pool and on OpenMP, also from several Python threads at once and in a forked
child; the pool choice follows the environment.
"""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qbackend  # noqa: F401
from qbackend.core.extension import _C
from tests.subprocess_utils import json_lines, run_py

ops = torch.ops.qbackend
THREADS = torch.get_num_threads()


@pytest.fixture
def own_pool():
    """qbackend's pool with all threads, whatever the environment chose."""
    before, threads = _C.own_pool(), torch.get_num_threads()
    _C.set_own_pool(True)
    torch.set_num_threads(THREADS)
    yield
    _C.set_own_pool(before)
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("own_pool")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5000), grain=st.integers(1, 3000), spin=st.sampled_from([0, 5, 200]))
def test_every_index_once(n, grain, spin):
    before = _C.spin_us()
    _C.set_spin_us(spin)
    try:
        r = _C.parallel_probe(n, grain)
    finally:
        _C.set_spin_us(before)
    assert r["visits"] == [1] * n
    if n > grain:  # several chunks, so a region on the pool: a loop nested in one of them runs serially
        assert r["nested_serial"]


@pytest.mark.usefixtures("own_pool")
@pytest.mark.skipif(THREADS < 2, reason="one intra-op thread")
def test_long_chunks_use_a_second_thread():
    # Two chunks of 30 ms: a worker wakes within microseconds to milliseconds and claims one. On a
    # machine so loaded that it never runs within 30 ms the caller takes both (correct, slower): try
    # a few times before calling that a failure.
    used = [_C.parallel_probe(2 * THREADS, 1, work_us=30000)["threads"] for _ in range(5)]
    assert max(used) >= 2, used


@pytest.mark.usefixtures("own_pool")
def test_thread_count_follows_torch():
    torch.set_num_threads(1)
    r = _C.parallel_probe(64, 1, work_us=1000)
    assert r["threads"] == 1 and r["visits"] == [1] * 64


@pytest.mark.usefixtures("own_pool")
def test_exception_reaches_the_caller_and_pool_survives():
    for throw_at in (0, 999):  # the caller's first chunk, the last chunk
        with pytest.raises(RuntimeError, match="chunk failed on purpose"):
            _C.parallel_probe(1000, 1, throw_at=throw_at)
    assert _C.parallel_probe(1000, 1)["visits"] == [1] * 1000


def _op_cases():
    """(name, fn) for an op of each kernel family, sized so that their loops split over threads. The
    int8 activations are 7-bit, which every ISA class takes (CPUs without VNNI need them)."""
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(0, 128, (256, 512), dtype=torch.uint8, generator=g)
    w8 = torch.randint(-127, 128, (1024, 512), dtype=torch.int8, generator=g)
    ws = torch.rand(1024, generator=g) * 0.01 + 1e-3
    bias = torch.randn(1024, generator=g)
    xf = torch.randn(300, 1000, generator=g)
    cases = [("quantize", lambda: ops.quantize_per_tensor(xf, 0.05, 3, torch.uint8))]
    pf = ops.fbgemm_linear_prepack(w8)
    cases.append(("fbgemm_linear", lambda: ops.fbgemm_linear(x8, 0.02, 64, pf, ws, bias, 0.3, 10, torch.uint8,
                                                              "relu")))
    img = torch.randint(0, 128, (4, 64, 28, 28), dtype=torch.uint8, generator=g).contiguous(
        memory_format=torch.channels_last)
    wc = torch.randint(-127, 128, (64, 64, 3, 3), dtype=torch.int8, generator=g)
    pc = ops.fbgemm_conv2d_prepack(wc, [1, 1], [1, 1], [1, 1], 1)
    cs = torch.rand(64, generator=g) * 0.01 + 1e-3
    cases.append(("fbgemm_conv2d", lambda: ops.fbgemm_conv2d(img, 0.02, 60, pc, cs, None, [1, 1], [1, 1], [1, 1], 1,
                                                              0.5, 5, torch.uint8, "none")))
    if _C.native_isa():
        p = ops.native_linear_prepack(w8)
        w1 = torch.randint(-127, 128, (128, 64, 1, 1), dtype=torch.int8, generator=g)
        pn = ops.native_conv2d_prepack(w1, [1, 1], [0, 0], [1, 1], 1)
        cases.append(("native_conv2d", lambda: ops.native_conv2d(img, 0.02, 60, pn, ws[:128], None, [1, 1], [0, 0],
                                                                  [1, 1], 1, 0.5, 5, torch.uint8, "relu")))
        cases.append(("native_linear", lambda: ops.native_linear(x8, 0.02, 64, p, ws, bias, 0.3, 10, torch.uint8,
                                                                  "gelu")))
    q, k, v = (torch.randn(2, 12, 128, 64, generator=g) for _ in range(3))
    cases.append(("attention", lambda: ops.attention(q, k, v, None, 0.125, False, torch.uint8, 0.02, 128, False)))
    x = torch.randn(512, 768, generator=g)
    r = torch.randn(512, 768, generator=g)
    s = torch.rand(768, generator=g) * 0.05 + 0.01
    cases.append(("layer_norm_quantize", lambda: ops.layer_norm_quantize(x, r, None, None, 1e-5, s, 128,
                                                                          torch.uint8, 255)))
    return cases


@pytest.mark.parametrize("name,fn", _op_cases(), ids=[c[0] for c in _op_cases()])
def test_ops_identical_on_both_pools(name, fn):
    before, threads = _C.own_pool(), torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        _C.set_own_pool(False)
        ref = fn()
        _C.set_own_pool(True)
        for _ in range(3):
            got = fn()
            for a, b in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
                assert torch.equal(a, b), name
    finally:
        _C.set_own_pool(before)
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("own_pool")
@pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX512-VNNI")
def test_concurrent_python_threads():
    """Regions from several threads at once: one runs on the pool, the others serially; all exact."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (384, 256), dtype=torch.uint8, generator=g)
    w = torch.randint(-127, 128, (512, 256), dtype=torch.int8, generator=g)
    p = ops.native_linear_prepack(w)
    ones = torch.ones(512)
    exact = ((x.to(torch.int64) - 128) @ w.to(torch.int64).t()).to(torch.float32)
    failures = []

    def work():
        for _ in range(20):
            y = ops.native_linear(x, 1.0, 128, p, ones, None, 1.0, 0, torch.float32, "none")
            if not torch.equal(y, exact):
                failures.append(float((y - exact).abs().max()))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


FORK_CHILD = """
import json, os, torch, qbackend
from qbackend.core.extension import _C
_C.set_own_pool(True)
torch.set_num_threads(2)
before = _C.parallel_probe(1000, 1, work_us=2000)  # the parent's pool starts its worker
pid = os.fork()
if pid == 0:
    r = _C.parallel_probe(1000, 1, work_us=2000)
    os._exit(0 if r["visits"] == [1] * 1000 else 3)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": status, "parent_ok": before["visits"] == [1] * 1000}))
"""


def test_forked_child_gets_a_fresh_pool():
    out = json_lines(run_py(FORK_CHILD, timeout=120, check=True))[-1]
    assert out == {"status": 0, "parent_ok": True}


@pytest.mark.parametrize("env,own", [
    ({}, False),
    ({"OMP_WAIT_POLICY": "passive"}, True),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, False),
    ({"GOMP_SPINCOUNT": "0"}, True),
    ({"OMP_WAIT_POLICY": "PASSIVE", "QBACKEND_THREADING": "openmp"}, False),
    ({"QBACKEND_THREADING": "own"}, True),
])
def test_pool_choice_follows_the_environment(env, own):
    base = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "", "QBACKEND_THREADING": "", "QBACKEND_SPIN_US": "50"}
    code = ("import json, qbackend\nfrom qbackend.core.extension import _C\n"
            "print(json.dumps({'own': _C.own_pool(), 'spin': _C.spin_us()}))")
    out = json_lines(run_py(code, env={**base, **env}, check=True))[-1]
    assert out == {"own": own, "spin": 50}
