"""qbackend's ops take large outputs (>= 1 MiB) from a cache of blocks freed by earlier outputs
(csrc/runtime/activation_cache.h), so activations above glibc's mmap threshold are not page-faulted
in again on every forward: a block is reused once its tensor dies, values are never stale, the
limit holds (0 turns the cache off), release frees it, and threads share it safely."""
from __future__ import annotations

import resource
import threading

import pytest
import torch

from qbackend.core.extension import _C
from qbackend.ops import reference as R

OPS = torch.ops.qbackend
BIG = (4, 64, 64, 96)  # 1.5 MiB as uint8


@pytest.fixture(autouse=True)
def fresh_cache():
    limit = _C.activation_cache_limit()
    _C.release_activation_cache()
    yield
    _C.set_activation_cache_limit(limit)
    _C.release_activation_cache()


def _quantize(seed, shape=BIG):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x, OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8)


def _expected(x):
    """The same op into a fresh allocation (a copy of the input: a tensor under 1 MiB at a time is
    not cached, so quantize row by row), checked against the fp64 reference."""
    rows = torch.stack([OPS.quantize_per_tensor(r.clone(), 0.05, 128, torch.uint8) for r in x])
    assert int((rows.int() - R.quantize(x, 0.05, 128, torch.uint8).int()).abs().max()) <= 1
    return rows


def test_a_freed_block_is_reused_with_fresh_values():
    _, q = _quantize(0)
    ptr, nbytes = q.data_ptr(), q.numel()
    del q
    assert _C.activation_cache_bytes() >= nbytes
    x, q = _quantize(1)
    assert q.data_ptr() == ptr and _C.activation_cache_bytes() == 0
    assert torch.equal(q, _expected(x))


def test_the_most_recently_freed_block_that_fits_is_reused():
    """An output takes the last freed block of at least its size and at most twice it (still in the
    CPU's caches), not an older one of its exact size; a block over twice its size is left alone."""
    _, a = _quantize(0, (4, 64, 64, 96))     # 1.5 MiB
    _, b = _quantize(1, (4, 64, 64, 160))    # 2.5 MiB
    _, big = _quantize(2, (16, 64, 64, 96))  # 6 MiB
    ptr_a, ptr_b, ptr_big = a.data_ptr(), b.data_ptr(), big.data_ptr()
    del a, b, big  # freed in that order: big is the most recent, then b
    x, q = _quantize(3, (4, 64, 64, 96))   # 1.5 MiB: big is over twice that, b fits
    assert q.data_ptr() == ptr_b
    assert torch.equal(q, _expected(x))
    _, r = _quantize(4, (4, 64, 64, 96))   # then the exact-size block a
    assert r.data_ptr() == ptr_a
    _, s = _quantize(5, (12, 64, 64, 96))  # 4.5 MiB: big
    assert s.data_ptr() == ptr_big


def test_small_outputs_are_not_cached():
    _, q = _quantize(0, (4, 16, 8, 8))
    del q
    assert _C.activation_cache_bytes() == 0


def test_limit_and_release():
    _C.set_activation_cache_limit(0)
    _, q = _quantize(0)
    del q
    assert _C.activation_cache_bytes() == 0
    _C.set_activation_cache_limit(1 << 30)
    outs = [_quantize(i)[1] for i in range(3)]
    del outs
    held = _C.activation_cache_bytes()
    assert held >= 3 * 4 * 64 * 64 * 96
    _C.set_activation_cache_limit(held - 1)  # over the new limit: everything is freed
    assert _C.activation_cache_bytes() == 0
    _C.set_activation_cache_limit(1 << 30)
    _, q = _quantize(5)
    del q
    assert _C.activation_cache_bytes() > 0
    _C.release_activation_cache()
    assert _C.activation_cache_bytes() == 0


def test_repeated_large_outputs_do_not_fault_pages_in():
    """40 MB outputs (above glibc's largest mmap threshold) made and freed in a loop: after the
    first, their pages are not faulted in again."""
    x = torch.randn(4, 96, 320, 320)
    OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8)  # the first one faults its pages in
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        q = OPS.quantize_per_tensor(x, 0.05, 128, torch.uint8)
        del q
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 2000, faults  # 5 fresh 39 MB outputs would take about 48,000


def test_threads_share_the_cache():
    errors = []

    def work(seed):
        try:
            for i in range(6):
                x, q = _quantize(seed * 100 + i)
                if not torch.equal(q, _expected(x)):
                    errors.append(seed)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
