"""The routing table: complete (a catch-all for every op on every CPU class), first-match, each
condition's text evaluating as its logic does on sample geometries, each row's evidence a result
file (and section) that exists."""
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from qbackend.dispatch import rules
from qbackend.dispatch.predicates import facts
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
    # AMX: the native AMX kernel at every M and on 1x1 convs (measured on an AMX Xeon).
    for m in (1, 4, 64, 2048):
        r = rules.choose("linear", "amx", {"m": m, "k": 768, "n": 768})
        assert r.provider == "native" and "INFERRED" not in r.why and r.evidence.startswith("xeon_amx/")
    pointwise = dict(CONV, kernel=(1, 1), padding=(0, 0))
    assert rules.choose("conv2d", "amx", pointwise).provider == "native"
    # KxK convs: native up to 1M output values (every ResNet 3x3 at batch 1), oneDNN's direct
    # convolution above (ResNet's 3x3 @56 at batch 32: 6.4M output values).
    assert rules.choose("conv2d", "amx", CONV).provider == "native"
    assert rules.choose("conv2d", "amx", dict(CONV, n=32)).provider == "onednn"
    assert rules.choose("conv2d", "amx", CONV, usable=NO_NATIVE).provider == "onednn"
    # Stems: native but for the 7x7 ImageNet stem at batch 32 (25.7M output values).
    stem = dict(CONV, c_in=3, h=224, w=224, kernel=(7, 7), stride=2, padding=(3, 3))
    assert rules.choose("conv2d", "amx", stem).provider == "native"
    assert rules.choose("conv2d", "amx", dict(stem, n=32)).provider == "onednn"
    # Residual 3x3s over 64-128 channels: native at batch 32 too; over 256 oneDNN.
    res = dict(CONV, int8_residual=1)
    assert rules.choose("conv2d", "amx", dict(res, n=32)).provider == "native"
    assert rules.choose("conv2d", "amx", dict(res, n=32, c_in=256, c_out=256, h=14, w=14)).provider == "onednn"
    # Depthwise: native up to 8M input values.
    amx_dw = dict(CONV, c_in=384, c_out=384, groups=384, h=14, w=14)  # 75k input values
    assert rules.choose("conv2d", "amx", amx_dw).provider == "native"
    assert rules.choose("conv2d", "amx", dict(amx_dw, n=32)).provider == "native"  # 2.4M
    big_dw = dict(CONV, c_in=32, c_out=32, groups=32, h=112, w=112, n=32)  # 12.8M input values
    assert rules.choose("conv2d", "amx", big_dw).provider == "onednn"
    assert rules.choose("conv2d", "amx", dict(amx_dw, n=32), usable=NO_NATIVE).provider == "onednn"
    # AVX-VNNI: the 256-bit native kernel, inferred likewise; oneDNN without it.
    r = rules.choose("linear", "avx2_vnni", {"m": 64, "k": 768, "n": 768})
    assert r.provider == "native" and "INFERRED" in r.why
    assert rules.choose("linear", "avx2_vnni", {"m": 64, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "onednn"
    assert rules.choose("conv2d", "avx2_vnni", pointwise).provider == "native"
    assert rules.choose("conv2d", vnni, pointwise).provider == "native"  # 200k output values
    assert rules.choose("conv2d", vnni, dict(pointwise, n=32)).provider == "native"  # 6.4M: every size
    assert rules.choose("conv2d", vnni, CONV).provider == "native"  # 3x3 at batch 1: 200k output values
    assert rules.choose("conv2d", vnni, dict(CONV, n=32)).provider == "native"  # 6.4M: the direct conv, any size
    assert rules.choose("conv2d", vnni, dict(CONV, n=32, stride=2)).provider == "native"  # gathered taps: 1.6M
    assert rules.choose("conv2d", vnni, dict(CONV, n=64, stride=2)).provider == "onednn"  # 3.2M
    big = dict(CONV, c_in=256, c_out=256, h=14, w=14)  # a 576 KB weight: the gathered taps, up to 2M values
    assert rules.choose("conv2d", vnni, big).provider == "native"
    assert rules.choose("conv2d", vnni, dict(big, n=64)).provider == "onednn"  # 3.2M
    assert rules.choose("conv2d", vnni, dict(CONV, groups=64)).provider == "native"  # depthwise, 64ch at 56x56
    wide_dw = dict(CONV, c_in=32, c_out=32, groups=32, h=112, w=112)  # 401k input values, 32 channels
    assert rules.choose("conv2d", vnni, wide_dw).provider == "native"  # stride 1: any size
    assert rules.choose("conv2d", vnni, dict(wide_dw, n=32)).provider == "native"
    assert rules.choose("conv2d", vnni, dict(wide_dw, stride=2)).provider == "native"  # stride 2: up to 4M values
    assert rules.choose("conv2d", vnni, dict(wide_dw, stride=2, n=32)).provider == "onednn"  # 12.8M
    assert rules.choose("conv2d", vnni, dict(wide_dw, c_in=96, c_out=96, groups=96, stride=2)).provider == "native"
    assert rules.choose("conv2d", vnni, dict(wide_dw, c_in=96, c_out=96, groups=96, stride=2, n=4)).provider == "onednn"
    assert rules.choose("conv2d", vnni, dict(CONV, groups=64, n=3)).provider == "native"  # 602k, a whole block
    assert rules.choose("conv2d", vnni, dict(CONV, c_in=80, c_out=80, groups=80, n=2)).provider == "native"  # stride 1
    small_dw = dict(CONV, c_in=384, c_out=384, groups=384, h=14, w=14)
    assert rules.choose("conv2d", vnni, small_dw).provider == "native"  # 75k input values
    assert rules.choose("conv2d", vnni, dict(small_dw, n=32, stride=2)).provider == "native"  # whole 64-channel blocks
    odd_dw = dict(CONV, c_in=144, c_out=144, groups=144, h=56, w=56)  # 452k input values, 2 blocks + 16
    assert rules.choose("conv2d", vnni, odd_dw).provider == "native"
    assert rules.choose("conv2d", vnni, dict(odd_dw, n=32)).provider == "native"  # stride 1
    assert rules.choose("conv2d", vnni, dict(odd_dw, n=32, stride=2)).provider == "onednn"  # 14.4M
    stem = dict(CONV, c_in=3, h=224, w=224, kernel=(7, 7), stride=2)
    assert rules.choose("conv2d", vnni, stem).provider == "native"  # 3 channels: the stem rule, any size
    assert rules.choose("conv2d", vnni, dict(stem, n=32)).provider == "native"
    assert rules.choose("conv2d", vnni, dict(stem, c_in=16, n=32)).provider == "onednn"  # dense, 25.7M values
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


@pytest.mark.parametrize("isa_class", ["avx2", "avx512"])
def test_no_vnni_rows_prefer_the_exact_gemm_within_x_7bit(isa_class):
    """Without VNNI: native (exact on 8-bit activations) unless FBGEMM's 7-bit route is more than
    X_7BIT faster (M = 4 .. 7 over K >= 2048); 8-bit inputs always run exactly (routing)."""
    assert rules.X_7BIT == 1.5
    assert rules.choose("linear", isa_class, {"m": 1, "k": 3072, "n": 768}).provider == "native"
    assert rules.choose("linear", isa_class, {"m": 4, "k": 768, "n": 3072}).provider == "native"
    assert rules.choose("linear", isa_class, {"m": 4, "k": 3072, "n": 768}).provider == "fbgemm"
    assert rules.choose("linear", isa_class, {"m": 8, "k": 3072, "n": 768}).provider == "native"
    assert rules.choose("linear", isa_class, {"m": 32, "k": 256, "n": 256}).provider == "native"
    assert rules.choose("linear", isa_class, {"m": 1, "k": 768, "n": 768}, usable=NO_NATIVE).provider == "fbgemm"
    assert rules.choose("conv2d", isa_class, CONV).provider == "onednn"


def test_router_skips_the_native_provider_where_it_cannot_run():
    from qbackend.dispatch import route
    from qbackend.dispatch.cpu import cpu_features
    from qbackend.dispatch.routing import exact_route_exists
    from qbackend.ops.providers import PROVIDERS

    refuses = PROVIDERS["native"].refuses
    pointwise = dict(CONV, kernel=(1, 1), padding=(0, 0))
    assert refuses("conv2d", dict(pointwise, padding=(1, 1))) is None
    assert refuses("conv2d", CONV) is None
    assert refuses("conv2d", dict(pointwise, groups=2)) is not None
    assert refuses("conv2d", dict(CONV, c_in=8192)) is not None  # 8192 x 9 > 65536: int32 sums
    assert refuses("linear", dict(LINEAR, k=70000)) is not None
    depthwise = dict(CONV, groups=64, c_out=128)  # a channel multiplier: not native's
    if exact_route_exists("conv2d", depthwise):
        r = route("conv2d", depthwise, forced="native")
    else:  # no VNNI in the hardware: only 7-bit activations have a route for a grouped conv
        with pytest.raises(ValueError, match="reduce_range=True"):
            route("conv2d", depthwise, forced="native")
        r = route("conv2d", depthwise, forced="native", eight_bit_input=False)
    assert r.provider != "native" and "native (forced) cannot run it" in r.why and not r.forced
    if cpu_features().isa_class == "avx512_vnni":
        assert route("linear", LINEAR).provider == "native"
        assert route("conv2d", pointwise).provider == "native"
        assert route("conv2d", CONV).provider == "native"
        assert route("conv2d", depthwise).provider != "native"
    with pytest.raises(ValueError, match="in_features > 65536"):  # no provider sums that many products in int32
        route("linear", dict(LINEAR, k=70000))


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


# ---- the table as data: each condition's text is its logic; each row's evidence exists ----------

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _namespace(op: str, shape: dict) -> dict:
    """The names a condition's text reads, computed here independently of predicates.facts."""
    ns = {"gelu": 0, "int8_residual": 0, "bf16_products_pay": 0, **shape}
    if op == "conv2d":
        s = shape.get("stride", 1)
        ns["stride"] = s if isinstance(s, int) else s[0]
        ns["kernel"] = tuple(shape["kernel"])
        ns["kh"], ns["kw"] = ns["kernel"]
        ns["oh"], ns["ow"] = math.ceil(shape["h"] / ns["stride"]), math.ceil(shape["w"] / ns["stride"])
    return ns


def _evaluate(text: str, ns: dict) -> bool:
    if text == "any shape":
        return True
    return bool(eval(compile(text, "<rule>", "eval"), {"__builtins__": {}}, ns))  # noqa: S307  (our own text)


def _samples(op: str) -> list[dict]:
    g = random.Random(0)
    if op == "linear":
        out = [{"m": m, "k": k, "n": n, "gelu": gl} for m in (1, 4, 5, 16, 17, 64, 65, 128, 256, 2048)
               for k, n in ((768, 768), (768, 3072), (3072, 768), (4096, 4096)) for gl in (0, 1)]
        return out + [{"m": g.randint(1, 4096), "k": g.randint(1, 8192), "n": g.randint(1, 8192),
                       "gelu": g.randint(0, 1)} for _ in range(300)]
    if op == "conv2d":
        out = []
        for _ in range(3000):
            c_in = g.choice((1, 3, 8, 16, 32, 64, 96, 144, 256, 512, 576, 960, 1024, 2048))
            groups = g.choice((1, 1, 1, c_in, max(1, c_in // 4), max(1, c_in // 8), 32 if c_in % 32 == 0 else 1))
            c_out = c_in if groups == c_in and g.random() < 0.8 else g.choice((16, 24, 64, 128, 256, 1024, 2048))
            k = g.choice((1, 1, 3, 5, 7))
            hw = g.choice((1, 7, 8, 14, 28, 56, 112, 224))
            out.append({"n": g.choice((1, 2, 7, 8, 32)), "c_in": c_in, "c_out": c_out, "h": hw, "w": hw,
                        "kernel": (k, k), "stride": g.choice((1, 2, (1, 1), (2, 2))), "padding": (k // 2, k // 2),
                        "groups": groups, "int8_residual": g.randint(0, 1)})
        return out
    if op == "attention":
        return [{"bf16_products_pay": 0}, {"bf16_products_pay": 1}]
    return [{"rows": r, "dim": d, "bits": b, "fp16_qparams": q, "padding_idx": p}
            for r in (10, 1 << 20) for d in (8, 64) for b in (4, 8) for q in (0, 1) for p in (0, 1)]


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: f"{r.op}:{','.join(r.isa_classes)}:{r.provider}")
def test_each_condition_is_its_text(rule):
    seen = set()
    for shape in _samples(rule.op):
        expected = _evaluate(rule.condition, _namespace(rule.op, shape))
        f = facts(rule.op, shape)
        assert rule.when(f) == expected, (rule.condition, shape)
        assert rule.when.compiled(f) is expected, (rule.when.source, shape)  # what `choose` evaluates
        seen.add(expected)
    if rule.condition != "any shape":
        assert seen == {True, False}, f"the samples never {'fail' if True in seen else 'meet'} {rule.condition!r}"


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: f"{r.op}:{','.join(r.isa_classes)}:{r.provider}")
def test_each_row_names_its_evidence(rule):
    assert rule.why and "\n" not in rule.why and len(rule.why) <= 240, rule.why
    path, _, section = rule.evidence.partition("#")
    file = RESULTS / path
    assert file.is_file(), f"{rule.evidence}: no such result file under benchmarks/results"
    if section:
        headings = [line.lstrip("#").strip() for line in file.read_text().splitlines() if line.startswith("#")]
        assert section in headings, f"{rule.evidence}: no heading {section!r} in {path}"
    assert rule.reason.endswith(f"(benchmarks/results/{rule.evidence})")


def test_conditions_render_as_written():
    assert rules.choose("linear", "avx512_vnni", LINEAR, usable=NO_NATIVE).condition == "m <= 4"
    texts = {r.condition for r in rules.RULES}
    assert "m <= 64 and k*n <= 768*3072" in texts
    assert "kernel == (1, 1) and groups == 1 and c_out <= 16 and n*oh*ow > 100_000" in texts
    assert "groups > 1 and groups < c_in and c_in//groups <= 8" in texts


def test_compiled_predicates_keep_their_grouping():
    """The compiled form parenthesises what the text leaves to Python's precedence: a product of
    a quotient, a negated disjunction, a flag missing from the facts."""
    from qbackend.dispatch.predicates import Flag, Num, Var

    a, b, c = Var("a"), Var("b"), Var("c")
    cases = [c * (a // b) == Num(6), ~((a <= 1) | (b <= 1)), Flag("gelu") & (a % b == Num(1)),
             (a * b) // c >= Num(2), Num((1, 1)) == Var("kernel")]
    for f in ({"a": 7, "b": 2, "c": 2, "kernel": (1, 1)}, {"a": 1, "b": 5, "c": 3, "gelu": 1, "kernel": (3, 3)},
              {"a": 9, "b": 4, "c": 1, "gelu": 1, "kernel": (1, 1)}):
        for p in cases:
            assert p.compiled(f) is p(f), (p.source, f)
    assert (c * (a // b) == Num(6)).compiled({"a": 7, "b": 2, "c": 2}) is True  # 2 * (7 // 2) = 6; (2*7)//2 = 7
    with pytest.raises(ValueError, match="no Python literal"):
        Num(float("nan"))


def test_seven_bit_table():
    conv3 = dict(CONV, c_in=64, c_out=64)
    # every conv keeps 8 bits: the libraries' 7-bit convs are 0.9-1.2x the exact native GEMM
    for shape in (conv3, dict(conv3, kernel=(1, 1), c_in=1024), dict(conv3, kernel=(1, 1), c_in=576),
                  dict(conv3, c_in=3, kernel=(7, 7)), dict(conv3, groups=64), dict(conv3, c_in=512, c_out=512)):
        assert rules.seven_bit_pays("conv2d", "avx2", shape) is None, shape
    # Linears: only M = 4 .. 7 over K >= 2048 (the native GEMM's 4-row tiles)
    assert rules.seven_bit_pays("linear", "avx2", {"m": 4, "k": 2048, "n": 1000}).op == "linear"
    assert rules.seven_bit_pays("linear", "avx2", {"m": 7, "k": 3072, "n": 768}) is not None
    assert rules.seven_bit_pays("linear", "avx2", {"m": 4, "k": 768, "n": 3072}) is None  # 1.37x at 2 threads
    assert rules.seven_bit_pays("linear", "avx2", {"m": 8, "k": 3072, "n": 768}) is None
    assert rules.seven_bit_pays("linear", "avx2", {"m": 128, "k": 3072, "n": 768}) is None
    assert rules.seven_bit_pays("linear", "avx2", {"m": 1, "k": 4096, "n": 4096}) is None
    for isa in ("amx", "avx512_vnni", "avx2_vnni", "avx512"):  # VNNI: 8 bits cost nothing; AVX-512: unmeasured
        assert rules.seven_bit_pays("conv2d", isa, conv3) is None and rules.seven_bit_pays("linear", isa, LINEAR) is None
    for row in rules.SEVEN_BIT:  # every row names its measurement
        path = row.evidence.split("#")[0]
        assert (Path(__file__).parents[2] / "benchmarks" / "results" / path).exists(), row.evidence
    with pytest.raises(ValueError, match="unknown ISA class"):
        rules.seven_bit_pays("conv2d", "sse", conv3)
    assert all(r.why and "\n" not in r.why and len(r.why) <= 240 for r in rules.SEVEN_BIT)


def test_seven_bit_weight_table():
    from qbackend.core.routes import FORCED, RULE, TUNED, BatchRoutes, Route
    from qbackend.dispatch.routing import seven_bit_weights

    conv3 = dict(CONV, c_in=64, c_out=64)
    # every dense conv on AVX2 (the pair products: 1.1-1.9x) but those of the Winograd route (3x3,
    # stride 1, 16-1824 input channels, from 12 x 12 outputs); depthwise convs keep 8 bits
    strided = dict(conv3, stride=2)
    for shape in (strided, dict(conv3, kernel=(1, 1), c_in=1024), dict(conv3, c_in=3, kernel=(7, 7)),
                  dict(conv3, c_in=8), dict(conv3, c_in=2048), dict(conv3, h=7, w=7, c_in=512, c_out=512)):
        assert rules.seven_bit_weights_pay("conv2d", "avx2", shape).op == "conv2d", shape
    for shape in (conv3, dict(conv3, h=14, w=14, c_in=256, c_out=256), dict(conv3, c_in=16), dict(conv3, c_in=1824)):
        assert rules.seven_bit_weights_pay("conv2d", "avx2", shape) is None, shape
    assert rules.seven_bit_weights_pay("conv2d", "avx2", dict(conv3, groups=64)) is None
    # Linears from 256 x 256, at every M
    for m in (1, 4, 128):
        assert rules.seven_bit_weights_pay("linear", "avx2", {"m": m, "k": 768, "n": 3072}).op == "linear"
    assert rules.seven_bit_weights_pay("linear", "avx2", {"m": 8, "k": 16, "n": 16}) is None
    assert rules.seven_bit_weights_pay("linear", "avx2", {"m": 8, "k": 4096, "n": 10}) is None
    for isa in ("amx", "avx512_vnni", "avx2_vnni", "avx512"):  # VNNI: 8 bits cost nothing; AVX-512: unmeasured
        assert rules.seven_bit_weights_pay("conv2d", isa, conv3) is None
        assert rules.seven_bit_weights_pay("linear", isa, LINEAR) is None
    for row in rules.SEVEN_BIT_WEIGHTS:
        assert (Path(__file__).parents[2] / "benchmarks" / "results" / row.evidence.split("#")[0]).exists()
    with pytest.raises(ValueError, match="unknown ISA class"):
        rules.seven_bit_weights_pay("conv2d", "sse", conv3)
    # only a rule route to the native provider, at every call size, takes 7-bit weights
    native = Route("native", RULE, "why")
    cpu = SimpleNamespace(isa_class="avx2")
    assert seven_bit_weights("conv2d", strided, native, cpu=cpu) is not None
    assert seven_bit_weights("conv2d", strided, Route("onednn", RULE, "why"), cpu=cpu) is None
    assert seven_bit_weights("conv2d", strided, Route("native", FORCED, "why"), cpu=cpu) is None
    assert seven_bit_weights("conv2d", strided, Route("native", TUNED, "why"), cpu=cpu) is None
    mixed = Route("native", RULE, "why", batch_routes=BatchRoutes("n", ((2, "native"), (None, "onednn"))))
    assert seven_bit_weights("conv2d", strided, mixed, cpu=cpu) is None
    assert seven_bit_weights("conv2d", strided, native, cpu=SimpleNamespace(isa_class="avx512_vnni")) is None


def test_exact_route_exists_reads_the_provider_the_environment_forces(monkeypatch):
    from qbackend.dispatch.routing import exact_route_exists

    assert exact_route_exists("linear", LINEAR)  # the native GEMM is exact on every AVX2 CPU
    monkeypatch.setenv("QBACKEND_PROVIDER", "fbgemm")
    assert exact_route_exists("linear", LINEAR) == bool(PROVIDERS["fbgemm"].exact_8bit("linear", LINEAR))
    assert exact_route_exists("linear", LINEAR, forced="native")  # the config's provider wins
