// The native int8 GEMM for AVX2 CPUs with AVX-VNNI: the 256-bit kernel of gemm_avx2_vnni_impl.h on
// the VEX-encoded vpdpbusd. Call only when qbackend::cpu::avx_vnni_usable().
#include <cstdint>

#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2 QB_ISA_AVX_VNNI)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

// The dot product of gemm_avx2_vnni_impl.h: the VEX-encoded instruction.
struct VexDot {
  static constexpr int kMaxRows = 6;  // 12 accumulators, 2 weight registers and a broadcast
  static constexpr bool kChained = true;
  static constexpr bool kFullTileLoop = false;
  __attribute__((always_inline)) static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpbusd_avx_epi32(acc, a, b);
  }
};

double peak_loop(int64_t iters) {
  // 12 independent accumulators (the instruction's latency x throughput), in assembly; {vex}
  // selects the AVX-VNNI encoding.
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        ".rept 4\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm0\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm1\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm2\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm3\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm4\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm5\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm6\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm7\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm8\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm9\n\t"
        "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm10\n\t %{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm11\n\t"
        ".endr\n\t" ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
  }
  return static_cast<double>(iters) * 48 * 32 * 2;
}

}  // namespace

const GemmKernels& gemm_kernels_avx2_vnni() {
  static const GemmKernels k{"avx2_vnni", &gemm<VexDot>, VexDot::kMaxRows, &peak_loop};
  return k;
}

}  // namespace qbackend::kernels
