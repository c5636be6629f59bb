"""Each kind of calibration statistic, split over "ranks" in one process and merged as the
distributed reduction merges it (qbackend.distributed.statistics, the collectives replaced by
their result), equals the statistic of one recorder that saw every batch, bit for bit; and the
recorders themselves do not depend on the order of the batches."""
from __future__ import annotations

import copy

import pytest
import torch

from qbackend.algorithms.gptq import HessianStats
from qbackend.algorithms.smoothquant import ChannelStats, row_keys
from qbackend.config import OBSERVERS
from qbackend.distributed import statistics
from qbackend.distributed.wire import decode, encode


def _reduce_locally(holders: list) -> None:
    """What reduce_statistics does to one statistic held by len(holders) ranks."""
    states = [decode(encode(statistics.local_state(h))) for h in holders]  # through the wire form
    rows = [decode(encode(statistics.sent_rows(h, states, r))) for r, h in enumerate(holders)]
    size = statistics.summed_size(holders[0], states)
    total = None
    if size:
        total, part = torch.zeros(size, dtype=torch.float64), torch.empty(size, dtype=torch.float64)
        for h in holders:
            statistics.pack(h, states, part)
            total += part
    for h in holders:
        statistics.apply(h, states, None if total is None else total.clone(), rows)


def _batches(seed=0, n=6, k=40, scale_step=0.7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3 + i, 5, k, generator=g) * (1 + scale_step * i) + 0.1 * i for i in range(n)]


SPLITS = [[[0, 1, 2], [3], [4, 5]], [[5, 4], [], [0, 1, 2, 3]], [[0], [1, 2, 3, 4, 5]]]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("k", [40, 600])  # one product; the block triangle of a wide H
def test_hessian_split_over_ranks_is_one_recorder(split, k):
    batches = _batches(k=k)
    one = HessianStats("x")
    for b in batches:
        one(b)
    ranks = [HessianStats("x") for _ in split]
    for r, shard in enumerate(split):
        for i in shard:
            ranks[r](batches[i])
    _reduce_locally(ranks)
    for r in ranks:
        assert r.rows == one.rows
        assert torch.equal(r.column_sum, one.column_sum)
        assert torch.equal(r.hessian, one.hessian)
    x = torch.cat([b.reshape(-1, k) for b in batches]).double()
    assert torch.allclose(one.hessian.double(), x.T @ x, rtol=1e-5, atol=1e-3)


def test_hessian_of_a_grouped_conv_split_over_ranks():
    conv = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 2}
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2 + i, 4, 6, 6, generator=g) for i in range(4)]
    one = HessianStats("x", conv)
    for b in batches:
        one(b)
    ranks = [HessianStats("x", conv) for _ in range(2)]
    for i, b in enumerate(batches):
        ranks[i % 2](b)
    _reduce_locally(ranks)
    assert one.hessian.shape == (2, 18, 18)
    for r in ranks:
        assert r.rows == one.rows and torch.equal(r.hessian, one.hessian)
        assert torch.equal(r.column_sum, one.column_sum)


def test_hessian_does_not_depend_on_the_order_of_the_batches():
    batches = _batches(k=600)
    a, b = HessianStats("x"), HessianStats("x")
    for x in batches:
        a(x)
    for x in reversed(batches):
        b(x)
    assert torch.equal(a.hessian, b.hessian)


@pytest.mark.parametrize("split", SPLITS)
def test_channel_stats_split_over_ranks_is_one_recorder(split):
    batches = _batches(k=24)
    one = ChannelStats("v", sample_rows=20)
    for b in batches:
        one(b)
    ranks = [ChannelStats("v", sample_rows=20) for _ in split]
    for r, shard in enumerate(split):
        for i in shard:
            ranks[r](batches[i])
    states = [statistics.local_state(x) for x in ranks]
    sent = [statistics.sent_rows(x, states, i) for i, x in enumerate(ranks)]
    assert sum(0 if s is None else s.shape[0] for s in sent) == 20  # one sample's worth of rows moves, not one per rank
    _reduce_locally(ranks)
    for r in ranks:
        assert r.rows_seen == one.rows_seen == sum(b.shape[0] * b.shape[1] for b in batches)
        assert torch.equal(r.absmax, one.absmax) and torch.equal(r.sample, one.sample)
        assert torch.equal(r.keys, one.keys)
    # the sample: the rows with the smallest keys of all rows, in key order
    rows = torch.cat([b.reshape(-1, 24) for b in batches])
    keys = row_keys(rows)
    assert torch.equal(one.sample, rows[keys.argsort()[:20]])


def test_channel_stats_merge_refuses_other_settings():
    with pytest.raises(ValueError, match="sample_rows"):
        ChannelStats("v", 10).merge(ChannelStats("w", 20))
    a, b = ChannelStats("v", 10), ChannelStats("v", 10)
    a(torch.randn(4, 3))
    b(torch.randn(4, 5))
    with pytest.raises(ValueError, match="channels"):
        a.merge(b)


def test_row_keys_are_a_function_of_the_row_alone():
    rows = torch.randn(50, 7)
    keys = row_keys(rows)
    assert keys.dtype == torch.int64 and keys.unique().numel() == 50
    assert torch.equal(row_keys(rows[[3, 1, 3]]), keys[[3, 1, 3]])
    other = rows.clone()
    other[5, 6] = torch.nextafter(other[5, 6], torch.tensor(10.0))  # one bit of one value
    changed = row_keys(other) != keys
    assert changed.tolist() == [i == 5 for i in range(50)]
    share = float((row_keys(torch.randn(20000, 16)) < 0).float().mean())
    assert 0.48 < share < 0.52  # the sign bit (and so the order) is balanced


EXACT_KINDS = [k for k in OBSERVERS if k != "moving_average_minmax"]


@pytest.mark.parametrize("kind", EXACT_KINDS)
@pytest.mark.parametrize("split", SPLITS)
def test_observer_split_over_ranks_is_one_observer(kind, split):
    spec = OBSERVERS[kind]
    kwargs = {"axis": 1} if kind == "per_channel_minmax" else {}
    batches = _batches(k=8, scale_step=3.0)
    one = spec(**kwargs)
    for b in batches:
        one.update(b)
    ranks = [spec(**kwargs) for _ in split]
    for r, shard in enumerate(split):
        for i in shard:
            ranks[r].update(batches[i])
    _reduce_locally(ranks)
    want = one.state_dict()
    for r in ranks:
        got = r.state_dict()
        assert got.keys() == want.keys() and got["config"] == want["config"]
        for key, v in want["stats"].items():
            w = got["stats"][key]
            assert (torch.equal(w, v) if isinstance(v, torch.Tensor) else w == v), (kind, key)
        assert r.compute_qparams() == one.compute_qparams()


def test_tail_histogram_beside_a_minmax_observer_merges():
    from qbackend.observers.outliers import TailHistogram

    batches = _batches(k=8, scale_step=5.0)
    one, ranks = TailHistogram(name="t"), [TailHistogram(name="t") for _ in range(2)]
    for i, b in enumerate(batches):
        one.update(b)
        ranks[i % 2].update(b)
    _reduce_locally(ranks)
    assert torch.equal(ranks[0].counts, one.counts) and ranks[1].min_val == one.min_val


def test_moving_average_observer_is_refused():
    obs = OBSERVERS["moving_average_minmax"]()
    assert "MovingAverageMinMaxObserver" in statistics.refusal("layer.input", obs)
    assert statistics.refusal("layer.input", OBSERVERS["minmax"]()) is None


def test_describe_tells_settings_apart():
    a, b = HessianStats("x"), HessianStats("x", second_moment=False)
    assert statistics.describe(a) != statistics.describe(b)
    assert statistics.describe(ChannelStats("v", 10)) != statistics.describe(ChannelStats("v", 11))
    h = OBSERVERS["histogram"]
    assert statistics.describe(h(bins=256)) != statistics.describe(h(bins=512))
    assert statistics.describe(copy.copy(h())) == statistics.describe(h())
