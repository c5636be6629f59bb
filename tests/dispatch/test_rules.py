"""The routing table: complete (a catch-all for every op on every CPU class) and first-match."""
import pytest

from qbackend.dispatch import rules
from qbackend.ops import PROVIDERS, registry

LINEAR = {"m": 1, "k": 768, "n": 768}
# The rows behind the native provider: where it cannot run (no VNNI, a grouped conv), these apply.
NO_NATIVE = lambda p: p != "native"  # noqa: E731
CONV = {"n": 1, "c_in": 64, "c_out": 64, "h": 56, "w": 56, "kernel": (3, 3), "stride": 1, "groups": 1}


@pytest.mark.parametrize("isa_class", rules.ISA_CLASSES)
@pytest.mark.parametrize("op,shape", [("linear", LINEAR), ("conv2d", CONV)])
def test_every_op_has_a_route_on_every_class(op, shape, isa_class):
    rule = rules.choose(op, isa_class, shape)
    assert rule.provider in PROVIDERS and rule.provider != "reference"
    assert rule.why


def test_rules_name_known_classes_and_providers():
    for rule in rules.RULES:
        assert set(rule.isa_classes) <= set(rules.ISA_CLASSES)
        assert rule.provider in registry.provider_names(registry.family_of(rule.op))


def test_embedding_rules_skip_providers_that_cannot_run_the_table():
    from qbackend.dispatch import route

    def route_embedding(shape, force=None):
        return route("embedding_bag", shape, eight_bit_input=False, forced=force)

    shape = {"rows": 1000, "dim": 64, "bits": 8, "fp16_qparams": 1, "padding_idx": 0}
    assert route_embedding(shape).provider == "fbgemm"
    assert route_embedding(dict(shape, padding_idx=1)).provider == "builtin"
    assert route_embedding(dict(shape, fp16_qparams=0)).provider == "builtin"
    assert route_embedding(shape, force="builtin").provider == "builtin"
    with pytest.raises(ValueError, match="cannot run this table"):
        route_embedding(dict(shape, padding_idx=1), force="fbgemm")


def test_native_rows():
    vnni = "avx512_vnni"
    for m in (1, 4, 64, 128, 2048):
        assert rules.choose("linear", vnni, {"m": m, "k": 768, "n": 3072, "gelu": 1}).provider == "native"
    # AMX: the native AMX kernel at every M and on 1x1 convs (inferred, marked so in the rule).
    for m in (1, 4, 64, 2048):
        r = rules.choose("linear", "amx", {"m": m, "k": 768, "n": 768})
        assert r.provider == "native" and "INFERRED" in r.why
    pointwise = dict(CONV, kernel=(1, 1), padding=(0, 0))
    assert rules.choose("conv2d", "amx", pointwise).provider == "native"
    assert rules.choose("conv2d", "amx", CONV).provider == "onednn"
    # AVX-VNNI: the 256-bit native kernel, inferred likewise; oneDNN without it.
    r = rules.choose("linear", "avx2_vnni", {"m": 64, "k": 768, "n": 768})
    assert r.provider == "native" and "INFERRED" in r.why
    assert rules.choose("linear", "avx2_vnni", {"m": 64, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("conv2d", "avx2_vnni", pointwise).provider == "native"
    assert rules.choose("conv2d", vnni, pointwise).provider == "native"  # 200k output values
    assert rules.choose("conv2d", vnni, dict(pointwise, n=32)).provider == "native"  # 6.4M: every size
    assert rules.choose("conv2d", vnni, CONV).provider == "native"  # 3x3 at batch 1: 200k output values
    assert rules.choose("conv2d", vnni, dict(CONV, n=32)).provider == "onednn"  # 6.4M
    assert rules.choose("conv2d", vnni, dict(CONV, groups=64)).provider == "onednn"  # depthwise at 56x56
    small_dw = dict(CONV, c_in=384, c_out=384, groups=384, h=14, w=14)
    assert rules.choose("conv2d", vnni, small_dw).provider == "native"  # 75k input values
    assert rules.choose("conv2d", vnni, dict(small_dw, n=32)).provider == "onednn"
    stem = dict(CONV, c_in=3, h=224, w=224, kernel=(7, 7), stride=2)
    assert rules.choose("conv2d", vnni, stem).provider != "native"  # 3 channels: oneDNN's direct conv
    # ResNet-50's stride-2 downsamples: native since it gathers the strided pixels into one GEMM
    # (1.06x the best of FBGEMM and oneDNN from 1024 channels at batch 1); FBGEMM without native.
    down = dict(pointwise, c_in=1024, c_out=2048, h=14, w=14, stride=(2, 2))
    assert rules.choose("conv2d", vnni, down).provider == "native"
    assert rules.choose("conv2d", vnni, down, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", vnni, dict(down, c_in=512, c_out=1024, h=28, w=28)).provider == "native"
    # 1x1 convs to <= 16 channels: native at batch 1 (12.5k pixels at 112x112), oneDNN over 100k pixels.
    thin = dict(pointwise, c_in=32, c_out=16, h=112, w=112, n=1)
    assert rules.choose("conv2d", vnni, thin).provider == "native"
    assert rules.choose("conv2d", vnni, dict(thin, n=8)).provider == "onednn"  # 100,352 pixels
    assert rules.choose("conv2d", vnni, dict(thin, n=7)).provider == "native"
    assert rules.choose("conv2d", vnni, dict(thin, n=32)).provider == "onednn"
    assert rules.choose("conv2d", vnni, dict(thin, n=32, c_out=24)).provider == "native"


def test_router_skips_the_native_provider_where_it_cannot_run():
    from qbackend.dispatch import route
    from qbackend.dispatch.cpu import cpu_features
    from qbackend.ops.providers import PROVIDERS

    refuses = PROVIDERS["native"].refuses
    pointwise = dict(CONV, kernel=(1, 1), padding=(0, 0))
    assert refuses("conv2d", dict(pointwise, padding=(1, 1))) is None
    assert refuses("conv2d", CONV) is None
    assert refuses("conv2d", dict(pointwise, groups=2)) is not None
    assert refuses("conv2d", dict(CONV, c_in=8192)) is not None  # 8192 x 9 > 65536: int32 sums
    assert refuses("linear", dict(LINEAR, k=70000)) is not None
    depthwise = dict(CONV, groups=64, c_out=128)  # a channel multiplier: not native's
    r = route("conv2d", depthwise, forced="native")
    assert r.provider != "native" and "native (forced) cannot run it" in r.why and not r.forced
    if cpu_features().isa_class == "avx512_vnni":
        assert route("linear", LINEAR).provider == "native"
        assert route("conv2d", pointwise).provider == "native"
        assert route("conv2d", CONV).provider == "native"
        assert route("conv2d", depthwise).provider != "native"
        assert route("linear", dict(LINEAR, k=70000)).provider == "fbgemm"


def test_first_match_wins():
    # On AMX, M <= 4 goes to FBGEMM and larger M to oneDNN (kernel-facts crossover).
    assert rules.choose("linear", "amx", {"m": 4, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("linear", "amx", {"m": 64, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "onednn"
    grouped = dict(CONV, c_in=128, c_out=128, groups=32)
    assert rules.choose("conv2d", "avx512_vnni", grouped, usable=NO_NATIVE).provider == "fbgemm"
    depthwise = dict(CONV, groups=64)
    assert rules.choose("conv2d", "avx512_vnni", depthwise, usable=NO_NATIVE).provider == "onednn"
    # Measured on AVX512-VNNI: 1x1 convs over few pixels go to FBGEMM, large ones to oneDNN.
    pointwise = dict(CONV, kernel=(1, 1), h=14, w=14)
    assert rules.choose("conv2d", "avx512_vnni", pointwise, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", "avx512_vnni", dict(pointwise, h=56, w=56), usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("linear", "avx512_vnni", {"m": 64, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("linear", "avx512_vnni", {"m": 256, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("linear", "avx512_vnni", {"m": 16, "k": 4096, "n": 4096}, usable=NO_NATIVE).provider == "onednn"


def test_unknown_class_is_an_error():
    with pytest.raises(ValueError, match="unknown ISA class"):
        rules.choose("linear", "sse2", LINEAR)
    with pytest.raises(ValueError, match="no dispatch rule"):
        rules.choose("matmul", "avx2", LINEAR)


def test_avx512_vnni_rules_from_the_dispatch_benchmark():
    vnni = "avx512_vnni"
    # A residual add with an int8 output: oneDNN fuses it; FBGEMM only wins the small ones.
    res = dict(CONV, c_in=256, c_out=1024, h=14, w=14, kernel=(1, 1), int8_residual=1)
    assert rules.choose("conv2d", vnni, res, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("conv2d", vnni, dict(res, int8_residual=0), usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", vnni, dict(res, c_in=384, c_out=64), usable=NO_NATIVE).provider == "fbgemm"  # 12544 values
    # Dense 3x3: oneDNN at every size ResNet-50 has (1.1-1.2x at batch 1 on a quiet machine).
    assert rules.choose("conv2d", vnni, dict(CONV, c_in=128, c_out=128, h=28, w=28), usable=NO_NATIVE).provider == "onednn"
    # Small dense convs (batch 1, tiny images): FBGEMM under oneDNN's per-call floor, unless the weight is big.
    small = dict(CONV, h=8, w=8)  # 64 -> 64 3x3 at 8x8: 4096 output values
    assert rules.choose("conv2d", vnni, small, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", vnni, dict(small, c_in=512, c_out=512, h=1, w=1), usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("conv2d", vnni, dict(small, h=56, w=56), usable=NO_NATIVE).provider == "onednn"
    # Stride-2 1x1 downsample from >= 512 channels: FBGEMM even at batch 32.
    down = dict(CONV, n=32, c_in=1024, c_out=2048, h=14, w=14, kernel=(1, 1), stride=(2, 2))
    assert rules.choose("conv2d", vnni, down, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", vnni, dict(down, c_in=256, c_out=512, h=56, w=56), usable=NO_NATIVE).provider == "onednn"
    # Linear: a fused GELU goes to oneDNN past M = 16; BERT's M = 128 projections to oneDNN.
    assert rules.choose("linear", vnni, {"m": 128, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("linear", vnni, {"m": 64, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("linear", vnni, {"m": 128, "k": 768, "n": 3072, "gelu": 1}, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("linear", vnni, {"m": 1, "k": 768, "n": 3072, "gelu": 1}, usable=NO_NATIVE).provider == "fbgemm"
    # Shape records saved before the flags existed route as without them.
    old = {k: v for k, v in res.items() if k != "int8_residual"}
    assert rules.choose("conv2d", vnni, old, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("linear", vnni, {"m": 64, "k": 768, "n": 3072}, usable=NO_NATIVE).provider == "fbgemm"
