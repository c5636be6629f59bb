// The native int8 GEMM for AVX2 CPUs without VNNI on weights of 7 bits (every |w| <= 64): the
// 256-bit kernel of gemm_avx2_vnni_impl.h with the dot product of 4 u8 x s8 products as AVX2's pair
// products, vpmaddubsw (two products summed into int16) then vpmaddwd against ones (two pairs into
// int32) and vpaddd. Exact for any uint8 activation when |w| <= 64: a pair is at most
// 2 * 255 * 64 = 32640 < 2**15, so vpmaddubsw never saturates. Three instructions per 32
// multiply-adds, where the 8-bit kernel (gemm_avx2.cpp: weights widened to int16, vpmaddwd) needs
// four and a widening of each weight vector. The provider calls it only for packed weights whose
// header says 7 bits (native_gemm.cpp); call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
#include <cstdint>

#include "kernels/asm_acc_tiles.h"
#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

// The dot product of gemm_avx2_vnni_impl.h on AVX2: exact only for |b| <= 64 (see above).
struct PairDot {
  // 10 accumulators, 2 weight registers, a broadcast, a product and the ones: 15 registers.
  static constexpr int kMaxRows = 5;
  // The accumulator enters only the final vpaddd (1 cycle): one accumulator set suffices.
  static constexpr bool kChained = false;
  static constexpr bool kFullTileLoop = true;
  __attribute__((always_inline)) static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
  }
  // The K loop of a full 5-row tile over `groups` k-groups of uint8 rows: accumulators in ymm0-9
  // (row r's halves in 2r and 2r + 1), the k-group's two weight vectors in ymm10-11, a row's
  // broadcast in ymm12, products in ymm13-14, the ones in ymm15. In assembly because the compiler
  // keeps a stack copy of each accumulator inside this loop. Stores the sums to out[0..9]. With pf,
  // k-group k also prefetches the line at pf + k * pf_step into L2 (dot_tile in gemm_avx2_vnni_impl.h).
  static void full_tile(const uint8_t* a, int64_t lda, const int8_t* B, int64_t ldb, int64_t groups, __m256i* out,
                        const int8_t* pf, int64_t pf_step) {
    const uint8_t* r0 = a;
    const uint8_t* r3 = a + 3 * lda;
#define QB_PAIR_ROW(ADDR, A0, A1)                                                  \
        "vpbroadcastd " ADDR ", %%ymm12\n\t"                                      \
        "vpmaddubsw %%ymm10, %%ymm12, %%ymm13\n\t"                                \
        "vpmaddubsw %%ymm11, %%ymm12, %%ymm14\n\t"                                \
        "vpmaddwd %%ymm15, %%ymm13, %%ymm13\n\t"                                  \
        "vpmaddwd %%ymm15, %%ymm14, %%ymm14\n\t"                                  \
        "vpaddd %%ymm13, %%" A0 ", %%" A0 "\n\t"                                  \
        "vpaddd %%ymm14, %%" A1 ", %%" A1 "\n\t"
#define QB_PAIR_LOOP(PREFETCH)                                                                     \
        QB_ASM_ZERO_ACC10                                                                          \
        "vpcmpeqw %%ymm15, %%ymm15, %%ymm15\n\t vpsrlw $15, %%ymm15, %%ymm15\n\t" /* int16 ones */    \
        QB_ASM_LOOP_OPEN("%[n]")                                                                   \
        "vmovdqu (%[b]), %%ymm10\n\t"                                                               \
        "vmovdqu 32(%[b]), %%ymm11\n\t"                                                             \
        "add %[ldb], %[b]\n\t"                                                                      \
        PREFETCH                                                                                   \
        QB_PAIR_ROW("(%[r0])", "ymm0", "ymm1")                                                     \
        QB_PAIR_ROW("(%[r0],%[s],1)", "ymm2", "ymm3")                                              \
        QB_PAIR_ROW("(%[r0],%[s],2)", "ymm4", "ymm5")                                              \
        QB_PAIR_ROW("(%[r3])", "ymm6", "ymm7")                                                     \
        QB_PAIR_ROW("(%[r3],%[s],1)", "ymm8", "ymm9")                                              \
        "add $4, %[r0]\n\t"                                                                         \
        "add $4, %[r3]\n\t"                                                                         \
        QB_ASM_LOOP_CLOSE("%[n]")                                                                  \
        QB_ASM_STORE_ACC10("%[out]")
#define QB_PAIR_CLOBBERS                                                                                       \
  "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
      "xmm12", "xmm13", "xmm14", "xmm15"
    if (pf) {
      __asm__ volatile(QB_PAIR_LOOP("prefetcht1 (%[pf])\n\t add %[pfs], %[pf]\n\t")
                       : [b] "+r"(B), [r0] "+r"(r0), [r3] "+r"(r3), [n] "+r"(groups), [pf] "+r"(pf)
                       : [ldb] "r"(ldb), [s] "r"(lda), [out] "r"(out), [pfs] "r"(pf_step)
                       : QB_PAIR_CLOBBERS);
    } else {
      __asm__ volatile(QB_PAIR_LOOP("")
                       : [b] "+r"(B), [r0] "+r"(r0), [r3] "+r"(r3), [n] "+r"(groups)
                       : [ldb] "r"(ldb), [s] "r"(lda), [out] "r"(out)
                       : QB_PAIR_CLOBBERS);
    }
#undef QB_PAIR_CLOBBERS
#undef QB_PAIR_LOOP
#undef QB_PAIR_ROW
  }
};

double peak_loop(int64_t iters) {
  // 10 independent accumulators, each a vpmaddubsw, a vpmaddwd against ones and a vpaddd: the
  // kernel's inner step without its loads.
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        ".rept 4\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\t vpmaddwd %%ymm12, %%ymm11, %%ymm12\n\t vpaddd %%ymm12, %%ymm0, %%ymm0\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\t vpmaddwd %%ymm13, %%ymm11, %%ymm13\n\t vpaddd %%ymm13, %%ymm1, %%ymm1\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\t vpmaddwd %%ymm12, %%ymm11, %%ymm12\n\t vpaddd %%ymm12, %%ymm2, %%ymm2\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\t vpmaddwd %%ymm13, %%ymm11, %%ymm13\n\t vpaddd %%ymm13, %%ymm3, %%ymm3\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\t vpmaddwd %%ymm12, %%ymm11, %%ymm12\n\t vpaddd %%ymm12, %%ymm4, %%ymm4\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\t vpmaddwd %%ymm13, %%ymm11, %%ymm13\n\t vpaddd %%ymm13, %%ymm5, %%ymm5\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\t vpmaddwd %%ymm12, %%ymm11, %%ymm12\n\t vpaddd %%ymm12, %%ymm6, %%ymm6\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\t vpmaddwd %%ymm13, %%ymm11, %%ymm13\n\t vpaddd %%ymm13, %%ymm7, %%ymm7\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\t vpmaddwd %%ymm12, %%ymm11, %%ymm12\n\t vpaddd %%ymm12, %%ymm8, %%ymm8\n\t"
        "vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\t vpmaddwd %%ymm13, %%ymm11, %%ymm13\n\t vpaddd %%ymm13, %%ymm9, %%ymm9\n\t"
        ".endr\n\t" ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm12", "xmm13");
  }
  return static_cast<double>(iters) * 40 * 32 * 2;
}

}  // namespace

const GemmKernels& gemm_kernels_avx2_pairs() {
  static const GemmKernels k{"avx2_pairs", &gemm<PairDot>, PairDot::kMaxRows, &peak_loop};
  return k;
}

}  // namespace qbackend::kernels
