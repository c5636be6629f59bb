"""The routing rules: which provider runs an op instance, declared as a table, not coded in branches.

Each Rule names an op kind, the CPU classes it applies to (CpuFeatures.isa_class), a shape
condition, the provider, and why (the measurement behind it). The first matching rule wins; the
last rule of each op kind is its catch-all. Measured with `python benchmarks/kernels.py`
(results in benchmarks/results/kernels.md); to regenerate, re-run it on a machine of each class
(or with QBACKEND_ISA set) and edit the table: the rows below say which column they came from.

Shape keys: linear: m (rows of x: batch x tokens), k, n, gelu (1: GELU fused after it). conv2d:
n (batch), c_in, c_out, h, w, kernel (kh, kw), stride, padding, groups, int8_residual (1: a residual
add fused into it, with an int8 output). The flags are read with .get(): models saved before they
existed route as without. embedding_bag: rows, dim, bits (8 / 4), fp16_qparams (1: fp16 scale and
bias), padding_idx (1: the bag skips a padding row).

The rules are read at a layer's example shape and, with QuantConfig.route_by_batch (the default),
at every batch size it may be called with (dispatch/batch_routes.py: a layer whose provider
changes with the batch is packed for each and picks per call), so a size condition here holds
per call, not only for the example the model was converted from.

A rule whose provider cannot run the op instance (Provider.refuses: the native provider needs
AVX512-VNNI or AVX-VNNI and runs Linear and unpadded 1x1 convs only) is skipped, so the next one
applies. Rows marked INFERRED were not measured on a CPU of their class (none was available):
they follow from measured facts named in their text, and `dispatch="tune"` measures instead.

The native rows were measured with `python benchmarks/kernels.py` (its native column) and the 1x1
convs of ResNet-50 and MobileNetV2 timed on the three providers (the note of issue 7). The
AVX512-VNNI conv and linear rows below were refined from `python benchmarks/dispatch.py`
(benchmarks/results/dispatch.md: every layer of ResNet-50, MobileNetV2 and BERT-base timed on
both providers at batch 1 and 32); the kernel benchmark gives the isolated shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from .cpu import ISA_CLASSES

ALL = ISA_CLASSES


def _channels_per_group(s: Mapping) -> int:
    return s["c_in"] // s["groups"]


def _is_1x1(s: Mapping) -> bool:
    return tuple(s["kernel"]) == (1, 1) and s["groups"] == 1


def _stride(s: Mapping) -> int:
    stride = s.get("stride", 1)
    return stride if isinstance(stride, int) else stride[0]


def _out_pixels(s: Mapping) -> int:
    stride = _stride(s)
    return s["n"] * -(-s["h"] // stride) * -(-s["w"] // stride)


@dataclass(frozen=True)
class Rule:
    op: str
    isa_classes: tuple[str, ...]
    provider: str
    why: str
    when: Callable[[Mapping], bool] = field(default=lambda s: True)
    condition: str = "any shape"


RULES: tuple[Rule, ...] = (
    # ---- linear (static and dynamic share the GEMM) ------------------------------------------
    Rule("linear", ("avx512_vnni",), "native", "qbackend's own VNNI GEMM: the fastest on 47 of the kernel benchmark's "
         "48 Linear rows (24 shapes at 1 and 2 threads; the 48th a tie), up to 1.9x the best of FBGEMM and oneDNN at "
         "M <= 4, 93-97% of the measured VNNI peak at M = 2048, K = N = 4096, ~3 us per call at 1x64x64 "
         "(benchmarks/results/kernels_native.md)"),
    Rule("linear", ("amx",), "native", "qbackend's own GEMM on AMX tiles (32 x 32 blocks of tdpbusd, rows and K "
         "remainders on VNNI, at M <= 15 the VNNI kernel) costs ~3 us per call, where torch's oneDNN op costs 34-40 us "
         "around a 1-2 us kernel (kernel-facts), and at M <= 4 the native VNNI GEMM beats FBGEMM (1.1-1.9x on "
         "AVX512-VNNI). INFERRED, not measured: no AMX machine was available; the kernel is verified against the VNNI "
         "kernel when first used, and `dispatch=\"tune\"` times it against oneDNN per layer"),
    Rule("linear", ("amx",), "fbgemm", "without the native provider: FBGEMM's VNNI GEMM has the lower per-call cost "
         "at M <= 4 (1.1-1.7x, kernel-facts)", when=lambda s: s["m"] <= 4, condition="m <= 4"),
    Rule("linear", ("amx",), "onednn", "without the native provider: oneDNN's AMX GEMM is 2-5x faster than FBGEMM "
         "from M = 16 (kernel-facts)"),
    Rule("linear", ("avx512_vnni",), "fbgemm", "FBGEMM has the lower per-call cost at M <= 4 (1.2-3.4x, "
         "benchmarks/results/kernels.md, AMD EPYC AVX512-VNNI)", when=lambda s: s["m"] <= 4, condition="m <= 4"),
    Rule("linear", ("avx512_vnni",), "onednn", "oneDNN fuses GELU, FBGEMM runs it on fp32 after the GEMM: "
         "BERT's FFN1 at M = 128 1.12x on oneDNN (benchmarks/results/dispatch.md)",
         when=lambda s: s.get("gelu", 0) and s["m"] > 16, condition="gelu and m > 16"),
    Rule("linear", ("avx512_vnni",), "fbgemm", "FBGEMM wins M <= 64 up to K x N = 768 x 3072 "
         "(benchmarks/results/kernels.md). At M = 128 (BERT at 1 x 128) the two trade places from run to run "
         "layer by layer (within ~1.2x either way), but the whole model with FBGEMM there was 1.12x slower than "
         "all-oneDNN (benchmarks/results/dispatch.md): oneDNN from M = 128",
         when=lambda s: s["m"] <= 64 and s["k"] * s["n"] <= 768 * 3072,
         condition="m <= 64 and k*n <= 768*3072"),
    Rule("linear", ("avx512_vnni",), "onednn", "oneDNN wins from M = 256 (M = 16 on 4096 x 4096) on "
         "AVX512-VNNI (benchmarks/results/kernels.md)"),
    Rule("linear", ("avx2_vnni",), "native", "qbackend's 256-bit AVX-VNNI GEMM (the AVX512 kernel's design on ymm "
         "registers: 6 x 16 register tiles, the same fused epilogue) at ~3 us per call, where torch's oneDNN op costs "
         "20-40 us; its code runs at 88% of the 256-bit dot-product peak (128 x 768 x 768, on AVX512-VNNI's encoding "
         "of the same instruction). INFERRED, not measured against oneDNN: no AVX-VNNI machine was available; "
         "`dispatch=\"tune\"` measures"),
    Rule("linear", ("avx2_vnni",), "onednn", "oneDNN uses AVX-VNNI, FBGEMM does not: 1.3-1.9x (kernel-facts)"),
    Rule("linear", ("avx512", "avx2"), "fbgemm", "without VNNI oneDNN int8 at M = 1 is 3-7x slower than "
         "FBGEMM (kernel-facts)"),
    # ---- conv2d ------------------------------------------------------------------------------
    Rule("conv2d", ALL, "fbgemm", "FBGEMM's groupwise kernel wins grouped conv with <= 8 channels per "
         "group (ResNeXt g=32: 2.3x, kernel-facts)",
         when=lambda s: 1 < s["groups"] < s["c_in"] and _channels_per_group(s) <= 8,
         condition="1 < groups < c_in and c_in/groups <= 8"),
    Rule("conv2d", ("avx512_vnni",), "onednn", "1x1 convs to <= 16 channels over more than 100k output pixels "
         "(MobileNetV2's 32 -> 16 @112 from batch 8): native's one-vector tiles load a weight vector and six "
         "activation words per six dot products, and oneDNN was the faster at batch 32 on both CPUs measured, 1.27x "
         "on an Intel Xeon and 1.03x on AMD EPYC (benchmarks/results/xeon/dispatch.md, dispatch.md); at batch 1 "
         "native is 1.9-3.7x ahead (the next row)",
         when=lambda s: _is_1x1(s) and s["c_out"] <= 16 and _out_pixels(s) > 100_000,
         condition="1x1, groups 1, c_out <= 16, n*oh*ow > 100k"),
    Rule("conv2d", ("avx512_vnni",), "native", "1x1 convs as one GEMM over the channels-last pixels (strided ones "
         "gathered first), residual and relu fused: against the best of oneDNN and FBGEMM on every distinct 1x1 conv "
         "of ResNet-50 and MobileNetV2 1.06-1.97x at batch 1 and 0.97-1.24x at batch 32; with a residual up to 3x. "
         "A residual with a float output (ResNet's last block) only native fuses: 4.5x oneDNN at batch 32 "
         "(benchmarks/results/pointwise_conv.md, dispatch.md)",
         when=_is_1x1, condition="1x1, groups 1, unpadded"),
    Rule("conv2d", ("avx2_vnni",), "native", "1x1 convs as one GEMM on the native AVX-VNNI kernel (the reasons of "
         "the AVX-VNNI Linear row). INFERRED, not measured; `dispatch=\"tune\"` measures",
         when=_is_1x1, condition="1x1, groups 1, unpadded"),
    Rule("conv2d", ("amx",), "native", "1x1 convs as one GEMM over the channels-last pixels on the native AMX "
         "kernel, residual fused (the reasons of the AMX Linear row). INFERRED, not measured on an AMX machine; "
         "`dispatch=\"tune\"` measures", when=_is_1x1, condition="1x1, groups 1, unpadded"),
    Rule("conv2d", ("avx512_vnni",), "native", "KxK convs with groups 1 as one GEMM per block of gathered taps "
         "(each output pixel's KH x KW x C bytes, the zero point in the padding), residual and relu fused: against "
         "the best of oneDNN and FBGEMM on every 3x3 conv of ResNet-18/50 1.04-1.16x at batch 1 (1.08-1.29x with a "
         "residual), 1.00-1.03x at batch 32 up to 2M output values, 0.91-0.99x beyond (the gather's share grows "
         "with the pixels per output channel); on 3-channel inputs (stems) 0.44-0.84x "
         "(benchmarks/results/kxk_conv.md)",
         when=lambda s: s["groups"] == 1 and s["c_in"] >= 16 and _out_pixels(s) * s["c_out"] <= 2_000_000,
         condition="groups 1, c_in >= 16, n*oh*ow*c_out <= 2M"),
    Rule("conv2d", ("avx512_vnni",), "native", "small depthwise convs: the native kernel (fp32 sums of exact integer "
         "products over input rows converted once) costs a few us per call where oneDNN's op costs 30-40: on "
         "MobileNetV2's depthwise convs up to 160k input values (its 28x28 to 7x7 layers at batch 1) 1.10-1.36x the "
         "best of oneDNN and FBGEMM, one at 0.91x (576 channels at 14x14); larger ones are oneDNN's (0.44-0.90x at "
         "56x56 and beyond, and at batch 32) (benchmarks/results/depthwise_conv.md)",
         when=lambda s: s["groups"] == s["c_in"] == s["c_out"] > 1 and s["n"] * s["h"] * s["w"] * s["c_in"] <= 160_000,
         condition="depthwise (groups = c_in = c_out), n*h*w*c_in <= 160k"),
    Rule("conv2d", ("avx512_vnni",), "fbgemm", "without the native provider, FBGEMM wins stride-2 1x1 convs from "
         "1024 input channels: ResNet-50's layer4 downsample 1.13x oneDNN at batch 1, level at batch 32 "
         "(benchmarks/results/pointwise_conv.md)",
         when=lambda s: _is_1x1(s) and _stride(s) == 2 and s["c_in"] >= 1024,
         condition="1x1, groups 1, stride 2, c_in >= 1024"),
    Rule("conv2d", ("avx512_vnni",), "onednn", "oneDNN fuses the residual add (sum post-op), FBGEMM adds it "
         "on fp32 after the conv: from 32k output values oneDNN is 1.15-3.4x faster at batch 1 and 7-33x at "
         "batch 32 (ResNet-50, MobileNetV2; benchmarks/results/dispatch.md)",
         when=lambda s: s.get("int8_residual", 0) and _out_pixels(s) * s["c_out"] > 32768,
         condition="int8 residual, n*oh*ow*c_out > 32768"),
    Rule("conv2d", ("avx512_vnni",), "fbgemm", "FBGEMM wins 1x1 convs over <= 784 output pixels (batch 1 at "
         "28x28 and below: 1.1-1.9x), oneDNN the larger ones (benchmarks/results/kernels.md, dispatch.md)",
         when=lambda s: _is_1x1(s) and _out_pixels(s) <= 784,
         condition="1x1, groups 1, n*oh*ow <= 784"),
    Rule("conv2d", ("avx512_vnni",), "fbgemm", "small dense convs are oneDNN's per-call floor (~25 us through "
         "torch's op) against FBGEMM's 7-22 us: 1.2-3.2x on ResNet-18 at 32x32, batch 1 (16x16 to 1x1 outputs); "
         "from 2.4M weight values oneDNN is ahead again (benchmarks/dispatch.py --quick)",
         when=lambda s: s["groups"] == 1 and _out_pixels(s) * s["c_out"] <= 16384
         and s["c_in"] * s["c_out"] * s["kernel"][0] * s["kernel"][1] <= 1_200_000,
         condition="groups 1, n*oh*ow*c_out <= 16384, c_in*c_out*kh*kw <= 1.2M"),
    Rule("conv2d", ALL, "onednn", "oneDNN wins dense, 1x1, stem and depthwise convs (1.1-8x, kernel-facts); "
         "FBGEMM's depthwise kernel also loses precision on 8-bit activations"),
    # ---- embedding_bag (and plain embedding lookups: bags of one) -------------------------------
    # Providers that cannot run a table (not installed, fp32 qparams, padding_idx) are skipped.
    Rule("embedding_bag", ALL, "fbgemm", "FBGEMM's JIT embedding kernels (through csrc, from libtorch): "
         "the fastest here: 8 tables of 1M x 64, batch 2048, 8-bit 5.3 ms vs fbgemm_gpu 9.7 and builtin 8.7; 4-bit "
         "8.3 vs 16.0 and 13.1 (benchmarks/results/embeddings.md)"),
    Rule("embedding_bag", ALL, "fbgemm_gpu", "fbgemm_gpu's table-batched lookup: the same FBGEMM kernels "
         "behind a Python call (never reached while fbgemm takes the same tables)"),
    Rule("embedding_bag", ALL, "builtin", "qbackend's own kernel runs every table (fp32 scale/bias, "
         "padding_idx), 1.6x slower than fbgemm on large tables"),
    # ---- attention cores (shape key bf16_products_pay: the CPU's measured bf16 vs fp32 rates) ----
    Rule("attention", ALL, "native", "qbackend's fused attention with bf16 products: 3.8x torch's SDPA on AMD "
         "EPYC Zen 4/5, where AVX512-BF16 dot products run at the fp32 FMA rate or faster (benchmarks/results/"
         "models_transformers.md)", when=lambda s: s.get("bf16_products_pay", 0), condition="bf16 products pay"),
    Rule("attention", ALL, "sdpa", "torch's SDPA: the fused kernel's fp32 products measured 1.3-1.9x slower per "
         "call on an Intel Xeon, whose bf16 dot products issue at a quarter of the FMA rate "
         "(benchmarks/results/xeon/README.md)"),
)


def choose(op: str, isa_class: str, shape: Mapping, usable: Callable[[str], bool] | None = None,
           missing_ok: bool = False) -> Rule | None:
    """The first rule for `op` on `isa_class` whose condition holds for `shape` (and, with
    `usable`, whose provider it accepts: providers that cannot run the op instance are skipped).
    No such rule: ValueError, or None with missing_ok."""
    if isa_class not in ISA_CLASSES:
        raise ValueError(f"unknown ISA class {isa_class!r}; expected one of {', '.join(ISA_CLASSES)}")
    for rule in RULES:
        if rule.op == op and isa_class in rule.isa_classes and rule.when(shape) \
                and (usable is None or usable(rule.provider)):
            return rule
    if missing_ok:
        return None
    raise ValueError(f"no dispatch rule for op {op!r} on {isa_class!r}")
