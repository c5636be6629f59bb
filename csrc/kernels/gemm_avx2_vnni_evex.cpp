// The native GEMM's 256-bit AVX-VNNI kernel (gemm_avx2_vnni_impl.h) compiled on the EVEX form of
// the same instruction (AVX512-VNNI + VL): the code of the AVX-VNNI kernel, runnable where the CPU
// has AVX512-VNNI but no AVX-VNNI (AMD Zen 4, Intel Ice Lake / Cascade Lake). The provider never
// picks it (the AVX512 kernel is faster there); the tests select it, so the AVX-VNNI kernel's
// tiles, remainders and epilogue are checked on such CPUs. Call only when has(Isa::Avx512Vnni).
#include <cstdint>

#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2 QB_ISA_VNNI_YMM)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

// The dot product of gemm_avx2_vnni_impl.h: the EVEX form (AVX512-VNNI + VL) on ymm registers.
struct EvexDot {
  static constexpr int kMaxRows = 6;  // 12 accumulators, 2 weight registers and a broadcast
  static constexpr bool kChained = true;
  static constexpr bool kFullTileLoop = false;
  __attribute__((always_inline)) static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpbusd_epi32(acc, a, b);
  }
};

}  // namespace

const GemmKernels& gemm_kernels_avx2_vnni_evex() {
  static const GemmKernels k{"avx2_vnni_evex", &gemm<EvexDot>, EvexDot::kMaxRows,
                             [](int64_t) -> double { return 0.0; }};  // no peak: a test vehicle
  return k;
}

}  // namespace qbackend::kernels
