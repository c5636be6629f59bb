"""The rule table: which provider runs an op instance, as data.

Each `Rule` names an op kind, the CPU classes it applies to (cpu.ISA_CLASSES, the column of
CpuFeatures.isa_class), a condition (a predicates.Predicate over the op instance's facts, which
renders its own text), the provider, one line saying why, and `evidence`: the measurement that
justifies it, as "<file under benchmarks/results/>" or "<file>#<section heading>". The first matching row
whose provider can run the op instance wins (routing.py skips providers that refuse it); the last
row of each op kind is its catch-all. Rows marked INFERRED were not measured on a CPU of their
class: they follow from the evidence named, and tune mode measures instead.

The facts a condition reads are predicates.facts(op, shape): linear m, k, n, gelu; conv2d n,
c_in, c_out, h, w, kernel, stride, oh, ow, groups, int8_residual; attention bf16_products_pay;
embedding_bag rows, dim, bits, fp16_qparams, padding_idx. They are read at a layer's example shape
and, with QuantConfig.route_by_batch, at every size it may be called with (batch_routes.py), so a
size condition holds per call.

To change a row, re-run the benchmark its evidence names on a CPU of its class (or with
QBACKEND_ISA set), commit the result, and edit the row and its evidence together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .cpu import ISA_CLASSES
from .predicates import ALWAYS, Flag, Num, Predicate, Var, facts

ALL = ISA_CLASSES
AMX, VNNI, AVX2_VNNI = ("amx",), ("avx512_vnni",), ("avx2_vnni",)
NO_VNNI = ("avx512", "avx2")

# The facts, by name (predicates.facts says what each is).
m, k, n, gelu = Var("m"), Var("k"), Var("n"), Flag("gelu")
c_in, c_out, groups, kernel, stride = Var("c_in"), Var("c_out"), Var("groups"), Var("kernel"), Var("stride")
oh, ow, h, w, kh, kw = Var("oh"), Var("ow"), Var("h"), Var("w"), Var("kh"), Var("kw")
int8_residual, bf16_products_pay = Flag("int8_residual"), Flag("bf16_products_pay")

# Without VNNI: how much faster a library's 7-bit route must be to win over the exact 8-bit native
# GEMM (see the NO_VNNI rows).
X_7BIT = 1.5

ONE_BY_ONE = (kernel == (1, 1)) & (groups == 1)
DEPTHWISE = (groups == c_in) & (c_in == c_out) & (c_in > 1)
OUT_PIXELS = n * oh * ow
OUT_VALUES = n * oh * ow * c_out


@dataclass(frozen=True)
class Rule:
    """One row of the rule table: op, CPU classes, condition, provider, why and its evidence."""

    op: str
    isa_classes: tuple[str, ...]
    provider: str
    why: str
    evidence: str
    when: Predicate = ALWAYS

    @property
    def condition(self) -> str:
        return self.when.text

    @property
    def reason(self) -> str:
        """One line: why, and where the evidence is."""
        return f"{self.why} (benchmarks/results/{self.evidence})"


RULES: tuple[Rule, ...] = (
    # ---- linear (static and dynamic share the GEMM) ------------------------------------------
    Rule("linear", AMX, "native", "qbackend's GEMM on AMX tiles: the fastest on 40 of 48 Linear rows, 1.3-3x the "
         "best library at M = 16-64; oneDNN ahead on 8 (M = 1024, 4096 x 4096) by 2-29%, not at both thread counts",
         "xeon_amx/kernels_linear.md#Linear, uint8 -> uint8"),
    Rule("linear", AMX, "fbgemm", "without the native provider: FBGEMM has the lower per-call cost at M <= 4",
         "xeon_amx/kernels_linear.md#Linear, uint8 -> uint8", m <= 4),
    Rule("linear", AMX, "onednn", "without the native provider: oneDNN's AMX GEMM is 2-4x FBGEMM from M = 64",
         "xeon_amx/kernels_linear.md#Linear, uint8 -> uint8"),
    Rule("linear", VNNI, "native", "qbackend's VNNI GEMM: the fastest on 47 of 48 Linear rows, up to 1.9x the best "
         "library at M <= 4", "kernels_native.md#Linear, uint8 -> uint8"),
    Rule("linear", VNNI, "fbgemm", "without the native provider: FBGEMM has the lower per-call cost at M <= 4 "
         "(1.2-3.4x)", "kernels.md#Linear, uint8 -> uint8", m <= 4),
    Rule("linear", VNNI, "onednn", "without the native provider: oneDNN fuses GELU, FBGEMM runs it unfused "
         "(BERT's FFN1 at M = 128: 1.12x)", "dispatch.md#bert_base 1x128, 2 threads", gelu & (m > 16)),
    Rule("linear", VNNI, "fbgemm", "without the native provider: FBGEMM wins M <= 64 up to 768 x 3072; at M = 128 "
         "the whole of BERT-base was 1.12x faster on oneDNN", "kernels.md#Linear, uint8 -> uint8",
         (m <= 64) & (k * n <= Num(768 * 3072, "768*3072"))),
    Rule("linear", VNNI, "onednn", "without the native provider: oneDNN wins from M = 256 (M = 16 on 4096 x 4096)",
         "kernels.md#Linear, uint8 -> uint8"),
    Rule("linear", AVX2_VNNI, "native", "qbackend's 256-bit AVX-VNNI GEMM: the fastest on 34 of 48 Linear rows, 82% "
         "of the 256-bit peak. INFERRED: measured under QBACKEND_ISA=avx2_vnni on an AVX512 Xeon",
         "xeon_amx/kernels_linear_avx2_vnni.md#Linear, uint8 -> uint8"),
    Rule("linear", AVX2_VNNI, "onednn", "without the native provider: oneDNN uses AVX-VNNI, FBGEMM does not",
         "xeon_amx/kernels_linear_avx2_vnni.md#Linear, uint8 -> uint8"),
    # Without VNNI the libraries are exact only on 7-bit activations, the native AVX2 GEMM on 8-bit
    # ones. 8-bit inputs always take an exact route (routing's correctness step); for 7-bit inputs
    # (dynamic Linears, reduce_range=True) a library row wins only where its 7-bit route is more than
    # X_7BIT times the exact one: a 7-bit input costs 6 dB of the layer's SQNR (48 -> 42 dB on every
    # row of the evidence), which we give up only for a speed-up well beyond this shared machine's
    # run-to-run spread (medians up to 2x the minima there).
    Rule("linear", NO_VNNI, "fbgemm", f"7-bit activations: FBGEMM's 7-bit GEMM is more than {X_7BIT}x the exact "
         "native AVX2 GEMM only at M = 4 over K >= 2048 (Zen 3: 1.6-1.8x at 1 and 2 threads); 8-bit activations "
         "take the native GEMM", "epyc_zen3/kernels_avx2_exact.md#Linear, 1 thread",
         (m >= 4) & (m < 8) & (k >= 2048)),
    Rule("linear", NO_VNNI, "native", f"qbackend's AVX2 GEMM (int16 products): exact on 8-bit activations, within "
         f"{X_7BIT}x of FBGEMM's 7-bit route from M = 8 (0.7-1.5x) and at M = 1 (0.8-1.4x; Zen 3)",
         "epyc_zen3/kernels_avx2_exact.md#Linear, 2 threads"),
    Rule("linear", NO_VNNI, "fbgemm", "without the native provider: without VNNI, FBGEMM is 3-7x oneDNN at M <= 4 "
         "and level from M = 256 (measured under QBACKEND_ISA=avx2)",
         "xeon_amx/kernels_linear_avx2.md#Linear, uint8 -> uint8"),
    # ---- conv2d ------------------------------------------------------------------------------
    Rule("conv2d", ALL, "fbgemm", "FBGEMM's groupwise kernel wins grouped convs with <= 8 channels per group "
         "(ResNeXt g=32 @56: 2.3x oneDNN)", "first_machine.md#Conv",
         (groups > 1) & (groups < c_in) & (c_in // groups <= 8)),
    Rule("conv2d", AMX, "native", "1x1 convs as one GEMM on AMX tiles: the fastest provider on all 70 of "
         "ResNet-50's and MobileNetV2's at batch 1, 53 of 70 at batch 32", "xeon_amx/dispatch.md#Summary", ONE_BY_ONE),
    Rule("conv2d", AMX, "native", "depthwise convs up to 8M input values on the AVX512-VNNI depthwise kernel: "
         "1.15-2.89x oneDNN on all of MobileNetV2's at batch 1 and 1.32-1.77x on those up to 4.8M input values at "
         "batch 32; oneDNN 1.1-1.6x faster from 12.8M", "xeon_amx/depthwise_conv.md",
         DEPTHWISE & (n * h * w * c_in <= 8_000_000)),
    Rule("conv2d", AMX, "native", "stems (1-15 input channels) on AMX tiles, K padded to whole tile steps: 1.37-3.60x "
         "the best library at batch 1, 1.28-1.82x at batch 32 to 12.8M outputs; the 7x7 ImageNet stem at batch 32 "
         "(25.7M): 1.12x alone, level in ResNets",
         "xeon_amx/kxk_conv.md", (groups == 1) & (c_in < 16) & (OUT_VALUES <= 16_000_000)),
    Rule("conv2d", AMX, "native", "residual 3x3s over 64 and 128 channels on the direct conv (AMX tiles reading the "
         "padded input in place), the int8 residual fused: 1.34x and 1.08x oneDNN at batch 32 (6.4M and 3.2M output "
         "values); over 256 channels oneDNN 1.10x", "xeon_amx/kxk_conv.md",
         (groups == 1) & (stride <= 2) & (c_in % 64 == 0) & (c_in <= 128) & int8_residual),
    Rule("conv2d", AMX, "native", "KxK convs on AMX tiles (direct or gathered taps): 1.70-2.57x oneDNN on every "
         "ResNet 3x3 at batch 1, 1.07-1.47x up to 0.8M output values at batch 32; from 1.6M 0.82-1.00x oneDNN",
         "xeon_amx/kxk_conv.md", (groups == 1) & (c_in >= 16) & (OUT_VALUES <= 1_000_000)),
    Rule("conv2d", VNNI, "onednn", "thin 1x1 convs over many pixels (MobileNetV2's 32 -> 16 @112 from batch 8): "
         "oneDNN 1.27x native on an Intel Xeon, 1.03x on AMD EPYC", "xeon/dispatch.md#mobilenet_v2 batch 32 @224, "
         "2 threads", ONE_BY_ONE & (c_out <= 16) & (OUT_PIXELS > 100_000)),
    Rule("conv2d", VNNI, "native", "1x1 convs as one GEMM over the channels-last pixels, residual and relu fused: "
         "1.06-1.97x the best library at batch 1, 0.97-1.24x at batch 32", "pointwise_conv.md",
         ONE_BY_ONE),
    Rule("conv2d", AVX2_VNNI, "native", "1x1 convs as one GEMM on the AVX-VNNI kernel. INFERRED from the AVX-VNNI "
         "Linear row", "xeon_amx/kernels_linear_avx2_vnni.md#Linear, uint8 -> uint8", ONE_BY_ONE),
    Rule("conv2d", VNNI, "native", "stems (1-15 input channels): the taps' kernel rows gathered as fixed-size copies; "
         "1.18-2.75x the best library at batch 1, 1.05-2.32x at batch 32 on every 1- and 3-channel stem "
         "(ImageNet 3x3 and 7x7, CIFAR, digits; Zen 5)", "epyc_zen5/kxk_conv_stems.md#Reading",
         (groups == 1) & (c_in < 16)),
    Rule("conv2d", VNNI, "native", "KxK convs ending a residual block (the int8 residual fused) at any size: at batch "
         "32 over 3.2M and 6.4M output values 1.15x and 1.09x oneDNN on Ice Lake, 1.00x on an AMD EPYC (kxk_conv.md)",
         "xeon_icelake/kxk_conv.md", (groups == 1) & (c_in >= 16) & int8_residual),
    Rule("conv2d", VNNI, "native", "stride-1 KxK convs on the direct conv (taps read in place), any size: ResNet's "
         "64 -> 64 @56 and 128 -> 128 @28 0.99-1.03x and 1.17-1.20x oneDNN at batch 32 (6.4M, 3.2M output values), "
         "1.31-1.42x at batch 1 (Ice Lake only)", "xeon_icelake/direct_conv_vnni.md",
         (groups == 1) & (stride == 1) & (c_in % 64 == 0) & (kh * kw * c_in * c_out <= 524_288)),
    Rule("conv2d", VNNI, "native", "KxK convs as GEMMs over gathered taps: 1.04-1.16x the best library on ResNet's "
         "3x3 convs at batch 1, 1.00-1.03x at batch 32 up to 2M output values", "kxk_conv.md",
         (groups == 1) & (c_in >= 16) & (OUT_VALUES <= 2_000_000)),
    Rule("conv2d", VNNI, "native", "depthwise convs of whole 64-channel blocks or stride 1 at any size, others up "
         "to 4M input values (Zen 5, MobileNetV2's: 1.06-2.98x oneDNN at batch 1, 1.39-1.68x at batch 32; "
         "stride 2 with 96/144 channels 0.89-0.99x)",
         "epyc_zen5/depthwise_conv.md",
         DEPTHWISE & ((c_in % 64 == 0) | (stride == 1) | (n * h * w * c_in <= 4_000_000))),
    Rule("conv2d", VNNI, "fbgemm", "without the native provider: FBGEMM wins stride-2 1x1 convs from 1024 input "
         "channels (1.13x oneDNN at batch 1)", "pointwise_conv.md",
         ONE_BY_ONE & (stride == 2) & (c_in >= 1024)),
    Rule("conv2d", VNNI, "onednn", "without the native provider: oneDNN fuses the residual add, FBGEMM adds it on "
         "fp32 (1.15-3.4x at batch 1 from 32k output values)", "dispatch.md#resnet50 batch 1 @224, 2 threads",
         int8_residual & (OUT_VALUES > 32768)),
    Rule("conv2d", VNNI, "fbgemm", "without the native provider: FBGEMM wins 1x1 convs over <= 784 output pixels "
         "(1.1-1.9x)", "kernels.md#Conv2d, channels-last uint8 -> uint8", ONE_BY_ONE & (OUT_PIXELS <= 784)),
    Rule("conv2d", VNNI, "fbgemm", "without the native provider: small dense convs sit at oneDNN's per-call floor; "
         "FBGEMM is 1.25-1.7x faster on ResNet-18's 8x8 convs", "xeon_amx/dispatch_quick_avx512_vnni.md#Summary",
         (groups == 1) & (OUT_VALUES <= 16384) & (c_in * c_out * kh * kw <= 1_200_000)),
    Rule("conv2d", ("avx2",), "native", "depthwise convs on the native AVX2 depthwise kernel (int16 products, exact at "
         "8 bits): 1.1-2.6x oneDNN's exact depthwise kernel on all 9 of MobileNetV2's at 2 threads, batch 1 (0.94-2.2x "
         "at 1 thread; Zen 3)", "epyc_zen3/kernels_avx2_exact.md#Conv2d, channels-last, batch 1, 2 threads", DEPTHWISE),
    Rule("conv2d", NO_VNNI, "onednn", "7-bit activations: the libraries' 7-bit convs are 0.9-1.2x the exact native AVX2 "
         "GEMM on Zen 3 (FBGEMM or oneDNN fastest by shape; oneDNN kept); 8-bit activations take the native GEMM or "
         "oneDNN's depthwise kernel, both exact", "epyc_zen3/kernels_avx2_exact.md#Conv2d, channels-last, batch 1, "
         "2 threads", groups == 1),
    Rule("conv2d", ALL, "onednn", "oneDNN wins dense, stem and depthwise convs (1.1-8x); FBGEMM's depthwise kernel "
         "also loses precision on 8-bit activations", "kernels.md#Conv2d, channels-last uint8 -> uint8"),
    # ---- embedding_bag (and plain embedding lookups: bags of one) -------------------------------
    Rule("embedding_bag", ALL, "fbgemm", "FBGEMM's JIT embedding kernels: the fastest on 1M x 64 tables",
         "embeddings.md#Table lookups (one batch, all tables, sum bags)"),
    Rule("embedding_bag", ALL, "fbgemm_gpu", "fbgemm_gpu's table-batched lookup: the same kernels behind a Python "
         "call", "embeddings.md#Table lookups (one batch, all tables, sum bags)"),
    Rule("embedding_bag", ALL, "builtin", "qbackend's own kernel runs every table (fp32 scale/bias, padding_idx)",
         "embeddings.md#Table lookups (one batch, all tables, sum bags)"),
    # ---- attention cores ---------------------------------------------------------------------
    Rule("attention", ALL, "native", "the fused attention with bf16 products: 3.8x torch's SDPA where bf16 dot "
         "products run at the fp32 FMA rate (AMD EPYC Zen 4/5)", "models_transformers.md#bert_base",
         bf16_products_pay),
    Rule("attention", ALL, "sdpa", "torch's SDPA: the fused kernel's fp32 products were 1.3-1.9x slower per call "
         "on an Intel Xeon, whose bf16 dot products issue at a quarter of the FMA rate",
         "xeon/README.md#What these runs showed, and what changed because of them"),
)


def choose(op: str, isa_class: str, shape: Mapping, usable: Callable[[str], bool] | None = None,
           missing_ok: bool = False) -> Rule | None:
    """The first rule for `op` on `isa_class` whose condition holds for `shape` (and, with
    `usable`, whose provider it accepts: providers that cannot run the op instance are skipped).
    No such rule: ValueError, or None with missing_ok."""
    if isa_class not in ISA_CLASSES:
        raise ValueError(f"unknown ISA class {isa_class!r}; expected one of {', '.join(ISA_CLASSES)}")
    f = facts(op, shape)
    for rule in RULES:
        if rule.op == op and isa_class in rule.isa_classes and rule.when.compiled(f) \
                and (usable is None or usable(rule.provider)):
            return rule
    if missing_ok:
        return None
    raise ValueError(f"no dispatch rule for op {op!r} on {isa_class!r}")


@dataclass(frozen=True)
class Fusion:
    """One row of the fusion table: a chain of int8 layers that runs as one native call (all of
    its layers on `provider`) on these CPU classes, with why and the measurement behind it."""

    chain: str
    isa_classes: tuple[str, ...]
    provider: str
    why: str
    evidence: str

    @property
    def describe(self) -> str:
        return f"{self.why} (benchmarks/results/{self.evidence})"


# Chains of layers the lowering may fuse (lowering/inverted_residual.py finds them). A chain not
# listed for a CPU class runs layer by layer, each layer routed by RULES.
FUSIONS: tuple[Fusion, ...] = (
    Fusion("inverted_residual", AMX + VNNI, "native", "an inverted-residual block (1x1 expansion, depthwise, 1x1 "
           "projection) in tiles of rows whose expanded activation stays in L2: the whole MobileNetV2 1.16x faster "
           "at batch 32 and 1.09x at batch 1 than layer by layer on the rule table's providers (EPYC Zen 4), "
           "bit-identical to its layers run one by one; on an AMX Xeon 1.21x at batch 1 and 1.22x at batch 32 "
           "(xeon_amx/inverted_residual.md)", "epyc_zen4/inverted_residual.md"),
    Fusion("inverted_residual", ("avx2",), "native", "the same block on the AVX2 GEMM and depthwise kernels: the "
           "whole MobileNetV2 1.08x faster at batch 32 and 1.02x at batch 1 than layer by layer (its blocks' steps "
           "1.17x and 1.03x; EPYC Zen 3), bit-identical", "epyc_zen3/inverted_residual.md"),
)


@dataclass(frozen=True)
class SevenBitRow:
    """One row of the 7-bit table: static layers (op, CPU classes, condition) whose fastest route on
    7-bit activations is measured more than X_7BIT times the exact 8-bit one, with why and where."""

    op: str
    isa_classes: tuple[str, ...]
    why: str
    evidence: str
    when: Predicate = ALWAYS

    @property
    def describe(self) -> str:
        return f"{self.why} (benchmarks/results/{self.evidence})"


# Where QuantConfig.seven_bit_for_speed gives a static layer's input 7 bits: without VNNI the
# libraries multiply 7-bit activations exactly with vpmaddubsw and need no widening of the weight,
# the exact 8-bit route (the native AVX2 GEMM) widens both operands to int16 (vpmaddwd); a 7-bit
# input costs about 6 dB of the layer's SQNR (48 -> 42 dB on every row of the evidence). A row only
# where both thread counts measure more than X_7BIT (the threshold of the dynamic Linear rows): the
# native GEMM's 4-row tiles, where a widened weight serves 4 rows, not 6. Measured on AVX2 only
# (AVX-512 without VNNI: none, 8 bits stay). The M of a static layer is its example's rows.
SEVEN_BIT: tuple[SevenBitRow, ...] = (
    SevenBitRow("linear", ("avx2",), f"FBGEMM's 7-bit GEMM more than {X_7BIT}x the exact native AVX2 GEMM at M = 4 "
                "over K >= 2048 (Zen 3: 1.6-1.8x at 1 and 2 threads); from M = 8, at M = 1 and on every conv "
                "0.8-1.5x: 8 bits", "epyc_zen3/kernels_avx2_exact.md#Linear, 2 threads",
                (m >= 4) & (m < 8) & (k >= 2048)),
)


# Where QuantConfig.seven_bit_for_speed gives a static layer's weight 7 bits (every level in
# [-64, 64] per output channel) when the native provider runs it: without VNNI the native GEMM then
# multiplies with AVX2's pair products (vpmaddubsw, exact for any uint8 input on such weights:
# kernels/gemm_avx2_pairs.cpp) instead of widening both operands to int16. Model output SQNR on the
# Zen 3 (benchmarks/results/epyc_zen3/kernels_avx2_pairs.md): ResNet-18 33.8 -> 31.0 dB, ResNet-50
# 16.4 -> 15.7, MobileNetV2 13.0 -> 12.6 for 1.14-1.48x (7-bit inputs instead cost 4.1, 1.5 and 1.4
# dB). Depthwise convs have their own kernel and keep 8 bits.
# Not the 3x3 stride-1 convs the native provider runs on its Winograd route there
# (csrc/providers/native_winograd.h: 16 to 1824 input channels, outputs from 12 x 12): exact on
# 8-bit weights, whose bits do not change its speed (benchmarks/results/epyc_zen3/winograd_avx2.md).
WINOGRAD_CONV = (kh == 3) & (kw == 3) & (stride == 1) & (c_in >= 16) & (c_in <= 1824) & (oh >= 12) & (ow >= 12)
SEVEN_BIT_WEIGHTS: tuple[SevenBitRow, ...] = (
    SevenBitRow("conv2d", ("avx2",), "the native GEMM's pair products on 7-bit weights 1.15-1.5x its int16 products on "
                "ResNet's and MobileNetV2's dense convs (Zen 3, 1 and 2 threads); 3x3 stride-1 convs from 12 x 12 "
                "outputs run on its Winograd route, exact at 8 bits", "epyc_zen3/kernels_avx2_pairs.md",
                (groups == 1) & ~WINOGRAD_CONV),
    SevenBitRow("linear", ("avx2",), "the native GEMM's pair products on 7-bit weights 1.1-1.7x its int16 "
                "products on Linears from 256 x 256 at M = 1 to 128 (Zen 3, 2 threads); smaller ones keep 8 bits, "
                "where a call's fixed cost leaves the products little to gain", "epyc_zen3/kernels_avx2_pairs.md",
                (k >= 256) & (n >= 256)),
)


def _seven_bit_row(table: tuple[SevenBitRow, ...], op: str, isa_class: str, shape: Mapping) -> SevenBitRow | None:
    """The first row of `table` for this static layer on `isa_class`, or None."""
    if isa_class not in ISA_CLASSES:
        raise ValueError(f"unknown ISA class {isa_class!r}; expected one of {', '.join(ISA_CLASSES)}")
    f = facts(op, shape)
    return next((r for r in table if r.op == op and isa_class in r.isa_classes and r.when.compiled(f)), None)


def seven_bit_weights_pay(op: str, isa_class: str, shape: Mapping) -> SevenBitRow | None:
    """The 7-bit weight table's row for this static layer on `isa_class` (when the native provider
    runs it), or None (8-bit weights cost no speed)."""
    return _seven_bit_row(SEVEN_BIT_WEIGHTS, op, isa_class, shape)


def seven_bit_pays(op: str, isa_class: str, shape: Mapping) -> SevenBitRow | None:
    """The 7-bit table's row for this static layer on `isa_class`, or None (8 bits cost no speed)."""
    return _seven_bit_row(SEVEN_BIT, op, isa_class, shape)


def fusion(chain: str, isa_class: str) -> Fusion | None:
    """The fusion row for `chain` on `isa_class`, or None (run the chain layer by layer)."""
    if isa_class not in ISA_CLASSES:
        raise ValueError(f"unknown ISA class {isa_class!r}; expected one of {', '.join(ISA_CLASSES)}")
    return next((f for f in FUSIONS if f.chain == chain and isa_class in f.isa_classes), None)
