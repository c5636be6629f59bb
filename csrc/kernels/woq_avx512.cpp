// AVX512 weight-only int8 products (woq_kernels.h): four output channels by up to four rows of x
// per pass, 16 weights a step (sign-extended, converted to float32, one FMA per row), the K tail
// masked. Only this file is compiled for AVX512 with FMA (pragma below, after the includes).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/woq_kernels.h"

QB_TARGET(QB_ISA_AVX512_FMA)
// GCC 12's false -Wmaybe-uninitialized inside the intrinsics headers (see avx512_common.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace qbackend::kernels {
namespace {

template <int MR>
void pass(const float* x, int64_t ldx, const int8_t* const wr[4], int64_t K, float acc_out[MR][4]) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    __m512 wv[4];
    if ((k & 63) == 0)  // the next pass's rows (4 rows on), one cache line per 64 weights
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 4 * K + k), _MM_HINT_T0);
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, wr[j] + k)));
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

#include "kernels/woq_rows_impl.h"

constexpr WoqKernels kTable{"avx512", &gemv_s8};

}  // namespace

const WoqKernels& woq_kernels_avx512() { return kTable; }

}  // namespace qbackend::kernels
