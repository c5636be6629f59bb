"""Tune mode: interleaved timing (on a fake clock: no real timings are asserted), tune's cache
hits and misses, and the cache file's trust rules (corrupt, foreign, unwritable, concurrent)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from qbackend.dispatch.tuner import (TuneCache, TuneCacheWarning, TuneKey, TuneResult, default_cache_path,
                                     machine_fingerprint, time_candidates, tune)
from tests.subprocess_utils import run_py

KEY = TuneKey.make("linear", {"m": 64, "k": 768, "n": 768}, out="uint8", post_op="relu", residual=False, x_bits=8)
KEY2 = TuneKey.make("conv2d", {"n": 1, "c_in": 64, "c_out": 64, "h": 56, "w": 56, "kernel": (3, 3),
                               "stride": (1, 1), "groups": 1}, post_op="none")
RESULT = TuneResult("onednn", {"onednn": 412.0, "fbgemm": 530.0})


class FakeClock:
    """Seconds that only move when a fake candidate runs."""

    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def fake_fn(clock: FakeClock, cost_s, log: list | None = None, name: str | None = None):
    """A candidate costing cost_s seconds per call (a float, or an iterator of per-call costs)."""
    costs = iter(cost_s) if not isinstance(cost_s, (int, float)) else None

    def fn():
        clock.t += next(costs) if costs is not None else cost_s
        if log is not None:
            log.append(name)
    return fn


TIMING = dict(warmup=0, rounds=3, min_round_s=0.0)


def builders_for(clock: FakeClock, costs: dict, built: list):
    def builder(p):
        def build():
            built.append(p)
            return fake_fn(clock, costs[p])
        return build
    return {p: builder(p) for p in costs}


def no_build(*_):
    raise AssertionError("a cache hit must not build anything")


# ---- time_candidates -----------------------------------------------------------------------

def test_time_candidates_picks_the_cheaper_and_runs_interleaved():
    clock, log = FakeClock(), []
    fns = {"a": fake_fn(clock, 3e-3, log, "a"), "b": fake_fn(clock, 1e-3, log, "b")}
    times = time_candidates(fns, warmup=1, rounds=3, min_round_s=0.002, clock=clock)
    assert times == {"a": pytest.approx(3000.0), "b": pytest.approx(1000.0)}
    assert min(times, key=times.get) == "b"
    # warmup a b; calibration: a once (3 ms >= 2 ms), b 1 call (1 ms) then 3 calls (3 ms);
    # rounds rotate the order: (a, bbb), (bbb, a), (a, bbb)
    assert log == ["a", "b", "a", "b", "b", "b", "b",
                   "a", "b", "b", "b", "b", "b", "b", "a", "a", "b", "b", "b"]


def test_time_candidates_rotates_the_order_each_round():
    clock, log = FakeClock(), []
    fns = {n: fake_fn(clock, 1e-4, log, n) for n in "abc"}
    time_candidates(fns, clock=clock, **TIMING)
    assert "".join(log) == "abc" + "abc" + "bca" + "cab"  # calibration, then rounds 0, 1, 2


def test_time_candidates_reports_the_median_per_call():
    clock = FakeClock()
    # calibration call, then one call per round (min_round_s=0): 5, 1, 100, 2, 3 ms -> median 3 ms
    slow_outlier = fake_fn(clock, [1e-3, 5e-3, 1e-3, 100e-3, 2e-3, 3e-3])
    times = time_candidates({"x": slow_outlier}, clock=clock, warmup=0, rounds=5, min_round_s=0.0)
    assert times["x"] == pytest.approx(3000.0)


def test_time_candidates_divides_a_round_by_its_calls():
    clock = FakeClock()
    times = time_candidates({"x": fake_fn(clock, 1e-5)}, clock=clock, warmup=0, rounds=3, min_round_s=1e-3)
    assert times["x"] == pytest.approx(10.0)


def test_time_candidates_rejects_bad_arguments():
    with pytest.raises(ValueError):
        time_candidates({})
    with pytest.raises(ValueError):
        time_candidates({"x": lambda: None}, rounds=0)


# ---- tune ------------------------------------------------------------------------------------

def test_tune_miss_builds_times_and_stores(tmp_path):
    clock, built = FakeClock(), []
    cache = TuneCache(tmp_path / "t.json")
    result, from_cache = tune(KEY, builders_for(clock, {"fbgemm": 2e-4, "onednn": 1e-4}, built), cache,
                              clock=clock, **TIMING)
    assert not from_cache and built == ["fbgemm", "onednn"]
    assert result.provider == "onednn"
    assert result.times_us == {"fbgemm": pytest.approx(200.0), "onednn": pytest.approx(100.0)}
    assert cache.get(KEY) == result
    # a new cache object on the same file: a hit, nothing built or timed
    hit, from_cache = tune(KEY, {"fbgemm": no_build, "onednn": no_build}, TuneCache(tmp_path / "t.json"))
    assert from_cache and hit == result


def test_tune_retunes_when_the_cached_provider_is_not_a_candidate(tmp_path):
    cache = TuneCache(tmp_path / "t.json")
    cache.put(KEY, RESULT)  # onednn
    clock, built = FakeClock(), []
    result, from_cache = tune(KEY, builders_for(clock, {"fbgemm": 5e-4}, built), cache, clock=clock, **TIMING)
    assert not from_cache and built == ["fbgemm"] and result.provider == "fbgemm"
    assert TuneCache(tmp_path / "t.json").get(KEY) == result


def test_tune_excludes_providers_that_cannot_run(tmp_path):
    clock, built = FakeClock(), []
    builders = builders_for(clock, {"onednn": 1e-4}, built)

    def refuses():
        raise ValueError("oneDNN refuses this geometry")

    def fails_on_first_call():
        def run():
            raise RuntimeError("kernel failed")
        return run

    result, _ = tune(KEY, {"fbgemm": refuses, **builders}, None, clock=clock, **TIMING)
    assert result.provider == "onednn" and set(result.times_us) == {"onednn"}
    result, _ = tune(KEY, {"fbgemm": fails_on_first_call, **builders}, None, clock=clock, **TIMING)
    assert result.provider == "onednn" and set(result.times_us) == {"onednn"}
    with pytest.raises(ValueError, match="no provider can run.*oneDNN refuses this geometry"):
        tune(KEY, {"fbgemm": fails_on_first_call, "onednn": refuses}, TuneCache(tmp_path / "t.json"))
    assert not (tmp_path / "t.json").exists()


def test_tune_does_not_catch_other_errors_or_unknown_providers():
    def broken():
        raise KeyError("a bug, not a refusal")

    with pytest.raises(KeyError):
        tune(KEY, {"fbgemm": broken})
    with pytest.raises(ValueError, match="unknown provider"):
        tune(KEY, {"cudnn": broken})


def test_tune_ties_go_to_the_first_builder():
    clock = FakeClock()
    result, _ = tune(KEY, builders_for(clock, {"fbgemm": 1e-4, "onednn": 1e-4}, []), clock=clock, **TIMING)
    assert result.provider == "fbgemm"


# ---- keys and results ------------------------------------------------------------------------

def test_tune_key_is_order_independent_and_json_serialisable():
    a = TuneKey.make("conv2d", {"n": 1, "kernel": [3, 3], "c_in": 8}, post_op="relu", out="uint8")
    b = TuneKey.make("conv2d", {"c_in": 8, "kernel": (3, 3), "n": 1}, out="uint8", post_op="relu")
    assert a == b and hash(a) == hash(b) and a.to_json() == b.to_json()
    assert a.shape == (("c_in", 8), ("kernel", (3, 3)), ("n", 1))
    assert a.variant == (("out", "uint8"), ("post_op", "relu"))
    json.loads(json.dumps(a.to_json()))
    assert TuneKey.from_json(a.to_json()) == a
    assert TuneKey.from_json(KEY.to_json()) == KEY  # bools in the variant stay bools
    assert TuneKey.make("linear", {"m": torch.tensor(3).item()}) == TuneKey.make("linear", {"m": 3})
    assert a != TuneKey.make("conv2d", {"n": 1, "kernel": (3, 3), "c_in": 8}, post_op="relu", out="float")
    with pytest.raises(TypeError):
        TuneKey.make("linear", {"m": 1.5})
    with pytest.raises(TypeError):
        TuneKey.make("linear", {"m": 1}, weird=object())


def test_tune_result_why():
    assert RESULT.why() == "tuned: onednn 412 us, fbgemm 530 us (1.29x)"
    small = TuneResult("fbgemm", {"onednn": 9.5, "fbgemm": 7.25})
    assert small.why() == "tuned: fbgemm 7.25 us, onednn 9.50 us (1.31x)"
    assert TuneResult("onednn", {"onednn": 42.0}).why() == "tuned: onednn 42.0 us (only candidate)"


# ---- the cache file --------------------------------------------------------------------------

def _fp_key(fp: dict) -> str:
    return json.dumps(fp, sort_keys=True, separators=(",", ":"))


def _file_with_entries(entries: dict) -> dict:
    fp = machine_fingerprint()
    section = {"fingerprint": fp, "entries": entries}
    return {"format": "qbackend-tune", "version": 1, "machines": {_fp_key(fp): section}}


def _valid_file() -> str:
    return json.dumps(_file_with_entries({KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": 1.0}}}))


GOOD_ENTRY = {"provider": "onednn", "times_us": {"onednn": 412.0, "fbgemm": 530.0}}
CORRUPT = {
    "garbage bytes": b"\x80\xff\x00\x13garbage\xfe",
    "empty": b"",
    "truncated": _valid_file()[: len(_valid_file()) // 2].encode(),
    "not an object": b"[1, 2, 3]",
    "wrong format": json.dumps({"format": "something-else", "version": 1, "machines": {}}).encode(),
    "wrong version": json.dumps({"format": "qbackend-tune", "version": 2, "machines": {}}).encode(),
    "machines not an object": json.dumps({"format": "qbackend-tune", "version": 1, "machines": []}).encode(),
    "section without fingerprint": json.dumps(
        {"format": "qbackend-tune", "version": 1, "machines": {"x": {"entries": {}}}}).encode(),
    "provider not a string": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": 3, "times_us": {"onednn": 1.0}}})).encode(),
    "times not an object": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": [1.0]}})).encode(),
    "time not a number": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": "fast"}}})).encode(),
    "non-finite time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": math.nan}}})).encode(),
    "infinite time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": 1.0, "fbgemm": math.inf}}})).encode(),
    "zero time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": 0.0}}})).encode(),
    "negative time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": 1.0, "fbgemm": -3.0}}})).encode(),
    "bool time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"onednn": True}}})).encode(),
    "unknown provider": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "cudnn", "times_us": {"cudnn": 1.0}}})).encode(),
    "provider without a time": json.dumps(_file_with_entries(
        {KEY.to_json(): {"provider": "onednn", "times_us": {"fbgemm": 1.0}}})).encode(),
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "non-finite fingerprint": json.dumps({"format": "qbackend-tune", "version": 1, "machines": {
        "x": {"fingerprint": {"threads": math.nan}, "entries": {}}}}).encode(),
    "key not a tune key": json.dumps(_file_with_entries({"linear-64": GOOD_ENTRY})).encode(),
    "entry not an object": json.dumps(_file_with_entries({KEY.to_json(): "onednn"})).encode(),
}


@pytest.mark.parametrize("case", CORRUPT)
def test_corrupt_file_warns_is_treated_empty_and_replaced(tmp_path, case):
    path = tmp_path / "tune-v1.json"
    path.write_bytes(CORRUPT[case])
    cache = TuneCache(path)
    with pytest.warns(TuneCacheWarning, match=str(path)) as record:
        assert cache.get(KEY) is None
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same problem is not warned again by this object
        assert cache.get(KEY) is None
        cache.put(KEY2, RESULT)
        doc = json.loads(path.read_text())
        assert doc["format"] == "qbackend-tune" and doc["version"] == 1
        fresh = TuneCache(path)  # the rewritten file is valid: no warning
        assert fresh.get(KEY2) == RESULT and fresh.get(KEY) is None


def test_bad_entries_are_dropped_and_good_ones_kept(tmp_path):
    path = tmp_path / "tune-v1.json"
    path.write_text(json.dumps(_file_with_entries({
        KEY.to_json(): GOOD_ENTRY,
        KEY2.to_json(): {"provider": "onednn", "times_us": {"onednn": math.nan}},
    })))
    with pytest.warns(TuneCacheWarning, match="dropped 1 invalid entry"):
        cache = TuneCache(path)
        assert cache.get(KEY2) is None
    assert cache.get(KEY) == RESULT
    cache.put(KEY2, RESULT)
    assert set(json.loads(path.read_text())["machines"][_fp_key(machine_fingerprint())]["entries"]) == \
        {KEY.to_json(), KEY2.to_json()}


def test_unreadable_file_warns(tmp_path):
    path = tmp_path / "tune-v1.json"
    path.mkdir()  # reading a directory fails even as root
    with pytest.warns(TuneCacheWarning, match="cannot read"):
        assert TuneCache(path).get(KEY) is None


def test_put_rejects_results_the_file_could_not_hold(tmp_path):
    cache = TuneCache(tmp_path / "t.json")
    with pytest.raises(ValueError, match="unknown provider"):
        cache.put(KEY, TuneResult("cudnn", {"cudnn": 1.0}))
    with pytest.raises(ValueError, match="finite"):
        cache.put(KEY, TuneResult("onednn", {"onednn": math.inf}))
    with pytest.raises(ValueError, match="positive"):
        cache.put(KEY, TuneResult("onednn", {"onednn": 0.0}))
    assert not (tmp_path / "t.json").exists()


def test_foreign_fingerprint_is_not_used_but_kept(tmp_path):
    path = tmp_path / "tune-v1.json"
    TuneCache(path).put(KEY, RESULT)
    doc = json.loads(path.read_text())
    (section,) = doc["machines"].values()
    section["fingerprint"]["cpu_model"] = "Some Other CPU"  # the outer key still says ours
    path.write_text(json.dumps(doc))
    cache = TuneCache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(KEY) is None
        cache.put(KEY2, TuneResult("fbgemm", {"fbgemm": 1.0}))
    machines = json.loads(path.read_text())["machines"]
    assert len(machines) == 2
    foreign = [s for s in machines.values() if s["fingerprint"]["cpu_model"] == "Some Other CPU"]
    assert len(foreign) == 1 and foreign[0]["entries"] == {KEY.to_json(): {"provider": "onednn",
                                                                          "times_us": dict(RESULT.times_us)}}
    assert TuneCache(path).get(KEY2).provider == "fbgemm" and TuneCache(path).get(KEY) is None


def test_thread_count_is_part_of_the_fingerprint(tmp_path):
    cache = TuneCache(tmp_path / "tune-v1.json")
    cache.put(KEY, RESULT)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2 if threads == 1 else 1)
        assert machine_fingerprint()["threads"] != threads
        assert cache.get(KEY) is None and TuneCache(cache.path).get(KEY) is None
    finally:
        torch.set_num_threads(threads)
    assert cache.get(KEY) == RESULT


def test_isa_override_is_part_of_the_fingerprint(tmp_path):
    path = tmp_path / "tune-v1.json"
    TuneCache(path).put(KEY, RESULT)
    child = f"""
from qbackend.dispatch.tuner import TuneCache, TuneKey, machine_fingerprint
key = TuneKey.from_json({KEY.to_json()!r})
print(machine_fingerprint()["isa_override"], TuneCache({str(path)!r}).get(key))
"""
    other = "avx2_vnni" if machine_fingerprint()["isa_override"] == "avx2" else "avx2"
    proc = run_py(child, env={"QBACKEND_ISA": other}, check=True)
    assert proc.stdout.split() == [other, "None"]


def test_unwritable_directory_warns_and_works_in_memory(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # its "subdirectory" cannot be created, even as root
    cache = TuneCache(blocker / "qbackend" / "tune-v1.json")
    with pytest.warns(TuneCacheWarning, match="cannot write.*kept in memory") as record:
        cache.put(KEY, RESULT)
    assert len(record) == 1
    clock = FakeClock()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per cache; a missing directory is no read error
        assert cache.get(KEY) == RESULT
        result, from_cache = tune(KEY2, builders_for(clock, {"fbgemm": 1e-4}, []), cache, clock=clock, **TIMING)
        assert not from_cache and cache.get(KEY2) == result
        assert tune(KEY2, {"fbgemm": no_build}, cache) == (result, True)


def test_default_cache_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QBACKEND_CACHE_DIR", str(tmp_path / "qb"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "qb" / "tune-v1.json"
    TuneCache().put(KEY, RESULT)
    assert (tmp_path / "qb" / "tune-v1.json").is_file()
    monkeypatch.delenv("QBACKEND_CACHE_DIR")
    assert default_cache_path() == tmp_path / "xdg" / "qbackend" / "tune-v1.json"
    assert TuneCache().path == default_cache_path()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_path() == tmp_path / "home" / ".cache" / "qbackend" / "tune-v1.json"


def test_two_writers_keep_each_others_entries(tmp_path):
    path = tmp_path / "tune-v1.json"
    a, b = TuneCache(path), TuneCache(path)
    assert a.get(KEY) is None and b.get(KEY2) is None  # both have read the (missing) file
    a.put(KEY, RESULT)
    b.put(KEY2, TuneResult("fbgemm", {"fbgemm": 3.0}))
    entries = json.loads(path.read_text())["machines"][_fp_key(machine_fingerprint())]["entries"]
    assert set(entries) == {KEY.to_json(), KEY2.to_json()}
    assert a.get(KEY2).provider == "fbgemm" and b.get(KEY) == RESULT
    a.put(KEY2, RESULT)  # same key: the last writer wins
    assert TuneCache(path).get(KEY2) == RESULT
    assert sorted(os.listdir(tmp_path)) == ["tune-v1.json", "tune-v1.json.lock"]  # no temp files left


def test_two_processes_writing_concurrently_lose_nothing(tmp_path):
    """Both children start their puts together (a file barrier), so their read-modify-writes
    overlap; without the lock file about half of the entries get lost."""
    path, go = tmp_path / "tune-v1.json", tmp_path / "go"
    child = """
import os, sys, time
from qbackend.dispatch.tuner import TuneCache, TuneKey, TuneResult
path, writer, go = sys.argv[1:]
cache = TuneCache(path)
open(go + "." + writer, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(100):
    cache.put(TuneKey.make("linear", {"m": i, "k": 8, "n": 8}, writer=writer),
              TuneResult("fbgemm", {"fbgemm": float(i + 1)}))
"""
    procs = [subprocess.Popen([sys.executable, "-c", child, str(path), w, str(go)], env=dict(os.environ),
                              stderr=subprocess.PIPE, text=True) for w in ("a", "b")]
    try:
        deadline = time.monotonic() + 60
        while not all(Path(f"{go}.{w}").exists() for w in "ab") and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.005)
        go.touch()
    finally:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    entries = json.loads(path.read_text())["machines"][_fp_key(machine_fingerprint())]["entries"]
    assert len(entries) == 200


def test_fingerprint_names_the_versions():
    import torch

    import qbackend

    fp = machine_fingerprint()
    assert fp["qbackend"] == qbackend.__version__ and fp["torch"] == torch.__version__
