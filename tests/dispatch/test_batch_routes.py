"""Batch routes (qbackend.dispatch.batch_routes, through route(by_batch=True)): the rule table's
provider over the sizes a layer may be called with, as ranges. Checked against route() at every evaluated size, against the rule
arithmetic of the native conv rows on this CPU class, and for the ranges' own validation."""
from __future__ import annotations

import pytest

from qbackend.dispatch import cpu_features, route
from qbackend.core.routes import BatchRoutes
from qbackend.dispatch.batch_routes import size_ranges, sizes


def batch_routes(op, shape, eight_bit_input=True, upto=None):
    """The rule table's providers over the sizes of op's size key (route's by-batch ranges, also
    where every size has one provider)."""
    return size_ranges(op, shape, lambda s: route(op, s, eight_bit_input=eight_bit_input).provider, upto)

DEPTHWISE = {"n": 8, "c_in": 160, "c_out": 160, "h": 28, "w": 28, "kernel": (3, 3), "stride": (2, 2),
             "padding": (1, 1), "groups": 160, "int8_residual": 0}
DENSE_3X3 = {"n": 8, "c_in": 64, "c_out": 64, "h": 56, "w": 56, "kernel": (3, 3), "stride": (1, 1),
             "padding": (1, 1), "groups": 1, "int8_residual": 0}
POINTWISE = {"n": 8, "c_in": 256, "c_out": 64, "h": 56, "w": 56, "kernel": (1, 1), "stride": (1, 1),
             "padding": (0, 0), "groups": 1, "int8_residual": 0}
LINEARS = [{"m": 8, "k": 768, "n": 768, "gelu": 0}, {"m": 128, "k": 768, "n": 3072, "gelu": 1},
           {"m": 1, "k": 4096, "n": 4096, "gelu": 0}]


@pytest.mark.parametrize("op,shape", [("conv2d", DEPTHWISE), ("conv2d", DENSE_3X3), ("conv2d", POINTWISE)]
                         + [("linear", s) for s in LINEARS])
@pytest.mark.parametrize("eight", [True, False])
def test_ranges_give_the_routers_choice_at_every_size(op, shape, eight):
    key = "n" if op == "conv2d" else "m"
    upto = max(64, 8 * shape[key])
    routes = batch_routes(op, shape, eight_bit_input=eight)
    assert routes == batch_routes(op, shape, eight_bit_input=eight, upto=upto)
    assert routes.key == key
    evaluated = sizes(upto)
    assert evaluated[-1] == upto and list(evaluated[:256]) == list(range(1, min(upto, 256) + 1))
    for size in evaluated:
        expected = route(op, {**shape, key: size}, eight_bit_input=eight).provider
        assert routes.provider_for(size) == expected, (size, routes.describe())
    # beyond the last evaluated size, the provider there
    assert routes.provider_for(10 ** 7) == route(op, {**shape, key: upto}, eight_bit_input=eight).provider


@pytest.mark.skipif(cpu_features().isa_class != "avx512_vnni", reason="the native conv rows of the AVX512-VNNI class")
def test_native_conv_ranges_end_where_the_rules_say():
    # depthwise stride 2 with 160 channels (two whole 64-channel blocks and 32): native while
    # n*h*w*c_in <= 4M, then oneDNN; with 192 (three whole blocks) or at stride 1 native at every size
    assert batch_routes("conv2d", dict(DEPTHWISE, c_in=192, c_out=192, groups=192)).ranges == ((None, "native"),)
    assert batch_routes("conv2d", dict(DEPTHWISE, stride=(1, 1))).ranges == ((None, "native"),)
    routes = batch_routes("conv2d", DEPTHWISE)
    last_native = 4_000_000 // (28 * 28 * 160)
    assert routes.ranges == ((last_native, "native"), (None, "onednn")), routes.describe()
    # dense 3x3 (groups 1, c_in >= 16) on the gathered taps (stride 2, or a weight over 512 KB): native
    # while n*oh*ow*c_out <= 2M; ending a residual block (the int8 residual fused) native at every size;
    # stride 1 over multiples of 64 channels with a weight up to 512 KB (the direct conv) native at every size
    for shape in ({**DENSE_3X3, "stride": (2, 2)}, {**DENSE_3X3, "c_in": 256, "c_out": 256, "h": 14, "w": 14}):
        routes = batch_routes("conv2d", shape)
        oh = -(-shape["h"] // shape["stride"][0])
        assert routes.ranges[0] == (2_000_000 // (oh * oh * shape["c_out"]), "native"), routes.describe()
        assert routes.provider_for(routes.ranges[0][0] + 1) == "onednn"
        assert batch_routes("conv2d", {**shape, "int8_residual": 1}).ranges == ((None, "native"),)
    assert batch_routes("conv2d", DENSE_3X3).ranges == ((None, "native"),)
    assert batch_routes("conv2d", {**DENSE_3X3, "c_in": 128, "c_out": 128, "h": 28, "w": 28}).ranges == \
        ((None, "native"),)
    # 1x1: native at every size -> one range
    assert batch_routes("conv2d", POINTWISE).ranges == ((None, "native"),)
    # routed up to max(64, 8 x the example's batch): a 7x7 conv with 512 channels turns to oneDNN
    # at n = 80, beyond 64 (example batch 8: one range), within 128 (example batch 16: two)
    late = {**DENSE_3X3, "c_in": 512, "c_out": 512, "h": 7, "w": 7}
    assert batch_routes("conv2d", late).ranges == ((None, "native"),)
    assert batch_routes("conv2d", {**late, "n": 16}).ranges == ((79, "native"), (None, "onednn"))


def test_describe_and_lookup():
    r = BatchRoutes("n", ((1, "fbgemm"), (4, "native"), (None, "onednn")))
    assert r.describe() == "n = 1: fbgemm; n 2-4: native; n >= 5: onednn"
    assert [r.provider_for(s) for s in (1, 2, 4, 5, 1000)] == ["fbgemm", "native", "native", "onednn", "onednn"]
    assert r.providers == ("fbgemm", "native", "onednn")
    assert BatchRoutes("m", ((3, "native"), (None, "onednn"))).describe() == "m <= 3: native; m >= 4: onednn"
    assert BatchRoutes.from_list("n", r.to_list()) == r


@pytest.mark.parametrize("ranges", [(), ((4, "native"),), ((4, "native"), (2, "fbgemm"), (None, "onednn")),
                                    ((0, "native"), (None, "onednn")), ((4, "native"), (4, "x"), (None, "onednn"))])
def test_bad_ranges_are_refused(ranges):
    with pytest.raises(ValueError, match="BatchRoutes"):
        BatchRoutes("n", ranges)


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="batch routes are defined for"):
        batch_routes("embedding_bag", {"rows": 10, "dim": 8, "bits": 8})


@pytest.mark.parametrize("op,shape", [("conv2d", DEPTHWISE), ("conv2d", DENSE_3X3), ("conv2d", POINTWISE)]
                         + [("linear", s) for s in LINEARS])
def test_route_by_batch_keeps_ranges_only_where_the_provider_changes(op, shape):
    routes = batch_routes(op, shape)
    r = route(op, shape, by_batch=True)
    assert r.provider == route(op, shape).provider
    assert r.batch_routes == (routes if len(routes.providers) > 1 else None)
    # 7-bit inputs: FBGEMM runs them on every CPU (8-bit ones it saturates without VNNI)
    assert route(op, shape, by_batch=True, forced="fbgemm", eight_bit_input=False).batch_routes is None
