// The native int8 GEMM (contract and packed layout: gemm_kernels.h) for AVX512-VNNI: register
// tiles of up to 6 rows x 64 columns (gemm_avx512_vnni_impl.h) accumulate with vpdpbusd over the
// whole K, the epilogue runs on the tile while it is still in registers; its direct convolution is
// conv_avx512_vnni.cpp's. Call only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512Vnni).
#include <cstdint>

#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512_VNNI)

#include "kernels/gemm_avx512_vnni_impl.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {
namespace {

void gemm(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t panel_begin, int64_t panel_end) {
  sweep(g, m_begin, m_end, panel_begin, panel_end, kMaxRows,
        [&](int64_t p, int64_t mb, int64_t me, NextPanel next, bool rows_cold) {
          vnni_panel_rows(g, p, mb, me, next, rows_cold);
        });
}

double peak_loop(int64_t iters) {
  // 24 independent accumulators (enough to cover the instruction's latency x throughput), written
  // in assembly so the compiler can neither spill them nor drop the work.
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        ".rept 2\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm16\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm17\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm18\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm19\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm20\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm21\n\t"
        "vpdpbusd %%zmm30, %%zmm31, %%zmm22\n\t vpdpbusd %%zmm30, %%zmm31, %%zmm23\n\t"
        ".endr\n\t" ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
              "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
              "xmm23");
  }
  return static_cast<double>(iters) * 48 * 64 * 2;
}

}  // namespace

const GemmKernels& gemm_kernels_avx512_vnni() {
  // The direct convolution where it measured faster than the gathered taps (Ice Lake, 2 threads:
  // 3x3 stride 1 over 64 to 128 channels 1.06-1.32x at batch 1 and 32; stride 2, and weights beyond
  // L2 at batch 32, 0.82-0.98x: benchmarks/results/xeon_icelake/direct_conv_vnni.md). The dispatch
  // row of such convs (qbackend/dispatch/rules.py) restates these limits; test_direct_conv.py holds
  // the two together.
  static const GemmKernels k{"avx512_vnni", &gemm, kMaxRows, &peak_loop, direct_conv_avx512_vnni(), true,
                             int64_t(512) << 10};
  return k;
}

}  // namespace qbackend::kernels
