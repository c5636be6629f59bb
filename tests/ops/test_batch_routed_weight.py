"""Packed weights with batch routes: one packed form per provider of the ranges, each call run by
the provider of its size (conv2d: the batch; linear: the rows), outputs equal to those of a
weight packed for that provider alone; pickling keeps the ranges, with_provider drops them."""
from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from qbackend.core.routes import BatchRoutes
from qbackend.ops import PackedConv2dWeight, PackedLinearWeight
from qbackend.ops import providers as providers_mod

CONV_ROUTES = BatchRoutes("n", ((2, "fbgemm"), (None, "onednn")))
LINEAR_ROUTES = BatchRoutes("m", ((3, "onednn"), (None, "fbgemm")))


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def calls(monkeypatch):
    """Records (provider, size) of every conv2d / linear / linear_dynamic call of fbgemm and oneDNN."""
    log = []
    for name in ("fbgemm", "onednn"):
        p = providers_mod.PROVIDERS[name]

        def spy(fn, name=name):
            def run(x, *args):
                log.append((name, x.shape[0] if x.dim() == 4 else x.numel() // x.shape[-1]))
                return fn(x, *args)
            return run
        monkeypatch.setitem(providers_mod.PROVIDERS, name, dataclasses.replace(
            p, conv2d=spy(p.conv2d), linear=spy(p.linear), linear_dynamic=spy(p.linear_dynamic), conv2d_add_=None))
    return log


def conv_weight(provider, routes=CONV_ROUTES):
    g = _gen(0)
    w = torch.randint(-127, 128, (24, 16, 3, 3), dtype=torch.int8, generator=g)
    return PackedConv2dWeight(w, torch.rand(24, generator=g) * 0.01 + 0.001, torch.randn(24, generator=g),
                              stride=1, padding=1, provider=provider, x_shape=[4, 16, 10, 10], x_qparams=(0.02, 7),
                              batch_routes=routes)


def linear_weight(provider, routes=LINEAR_ROUTES):
    g = _gen(1)
    w = torch.randint(-127, 128, (40, 64), dtype=torch.int8, generator=g)
    return PackedLinearWeight(w, torch.rand(40, generator=g) * 0.01 + 0.001, torch.randn(40, generator=g),
                              provider=provider, x_shape=[8, 64], batch_routes=routes)


def x_conv(n):  # 7-bit activations: exact on every provider and CPU
    return torch.randint(0, 128, (n, 16, 10, 10), dtype=torch.uint8, generator=_gen(n)).contiguous(
        memory_format=torch.channels_last)


def run_conv(pw, n):
    return pw.conv2d(x_conv(n), 0.02, 7, 0.1, 5, torch.uint8, "relu")


def test_conv_calls_run_on_the_provider_of_their_batch(calls):
    pw = conv_weight("onednn")
    assert pw.provider_name == "onednn" and pw.packed_providers == ("fbgemm", "onednn")
    alone = {p: conv_weight(p, routes=None) for p in ("fbgemm", "onednn")}
    for n, expected in ((1, "fbgemm"), (2, "fbgemm"), (3, "onednn"), (6, "onednn")):
        calls.clear()
        y = run_conv(pw, n)
        assert calls == [(expected, n)], (n, calls)
        assert torch.equal(y, run_conv(alone[expected], n)), f"batch {n}: differs from {expected} alone"


def test_conv_add_in_place_follows_the_route(calls):
    pw = conv_weight("onednn")
    for n, expected in ((2, "fbgemm"), (5, "onednn")):
        y = run_conv(conv_weight(expected, routes=None), n)
        accum = torch.randint(0, 128, y.shape, dtype=torch.uint8, generator=_gen(9)).contiguous(
            memory_format=torch.channels_last)
        calls.clear()
        out = pw.conv2d_add_(x_conv(n), 0.02, 7, 0.1, 5, torch.uint8, "relu", accum.clone(), 0.07, 4)
        assert calls == [(expected, n)]
        ref = conv_weight(expected, routes=None).conv2d(x_conv(n), 0.02, 7, 0.1, 5, torch.uint8, "relu", accum,
                                                        0.07, 4)
        assert torch.equal(out, ref)


def test_linear_calls_run_on_the_provider_of_their_rows(calls):
    pw = linear_weight("fbgemm")
    alone = {p: linear_weight(p, routes=None) for p in ("fbgemm", "onednn")}
    for shape, expected in (((3, 64), "onednn"), ((1, 2, 64), "onednn"), ((2, 2, 64), "fbgemm"), ((9, 64), "fbgemm")):
        x = torch.randint(0, 128, shape, dtype=torch.uint8, generator=_gen(sum(shape)))
        rows = x.numel() // 64
        calls.clear()
        y = pw.linear(x, 0.02, 7, 0.05, 3, torch.uint8, "none")
        assert calls == [(expected, rows)], (shape, calls)
        assert torch.equal(y, alone[expected].linear(x, 0.02, 7, 0.05, 3, torch.uint8, "none"))
        xf = torch.randn(shape, generator=_gen(rows))
        calls.clear()
        yd = pw.linear_dynamic(xf)
        assert calls == [(expected, rows)]
        assert torch.equal(yd, alone[expected].linear_dynamic(xf))


def test_symbolic_size_takes_the_main_provider():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    pw = conv_weight("onednn")
    assert pw._form(2)[0].name == "fbgemm"
    size = ShapeEnv().create_unbacked_symint()  # a batch size torch.export keeps symbolic
    assert isinstance(size, torch.SymInt) and pw._form(size)[0].name == "onednn"


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_round_trip_keeps_routes(how):
    pw = conv_weight("onednn")
    loaded = pickle.loads(pickle.dumps(pw)) if how == "pickle" else copy.deepcopy(pw)
    assert loaded.batch_routes == CONV_ROUTES and loaded.provider_name == "onednn"
    for n in (1, 3):
        assert torch.equal(run_conv(loaded, n), run_conv(pw, n))
    assert "batch_routes='n <= 2: fbgemm; n >= 3: onednn'" in repr(loaded)


def test_with_provider_drops_routes(calls):
    pw = conv_weight("onednn").with_provider("fbgemm")
    assert pw.batch_routes is None and pw.packed_providers == ("fbgemm",)
    run_conv(pw, 5)
    assert calls == [("fbgemm", 5)]


def test_routes_without_the_main_provider_or_with_one_provider_are_dropped():
    assert conv_weight("onednn", routes=BatchRoutes("n", ((None, "onednn"),))).batch_routes is None
    assert conv_weight("onednn", routes=BatchRoutes("n", ((2, "fbgemm"), (None, "reference")))).batch_routes is None


def test_a_provider_refusing_the_geometry_leaves_its_sizes_to_the_main_one(monkeypatch, calls):
    p = providers_mod.PROVIDERS["fbgemm"]

    def refuse(*args):
        raise ValueError("refused for the test")
    monkeypatch.setitem(providers_mod.PROVIDERS, "fbgemm", dataclasses.replace(p, prepack_conv2d=refuse))
    pw = conv_weight("onednn")
    run_conv(pw, 1)
    assert calls == [("onednn", 1)]
