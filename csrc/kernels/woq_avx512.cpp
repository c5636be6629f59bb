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

// 16 nibbles of 8 bytes (fewer at the row's end, the rest read as 0) as 16 floats in k order.
inline __m512 nibbles(const uint8_t* p, int64_t nbytes) {
  const __m128i b = _mm_maskz_loadu_epi8(__mmask16((1u << nbytes) - 1), p);
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i u = _mm_unpacklo_epi8(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u));
}

template <int MR>
void pass4(const float* x, int64_t ldx, const uint8_t* const wr[4], const float* const sc[4], const float* const of[4],
           int64_t K, int64_t G, int64_t ldw, float acc_out[MR][4]) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const int64_t left = K - k;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const int64_t nbytes = left >= 16 ? 8 : (left + 1) / 2;
    const int64_t g = k / G;
    if ((k & 127) == 0)  // the next pass's rows (4 rows on), one cache line per 128 weights
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 4 * ldw + k / 2), _MM_HINT_T0);
    __m512 wv[4];
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm512_fmadd_ps(nibbles(wr[j] + k / 2, nbytes), _mm512_set1_ps(sc[j][g]), _mm512_set1_ps(of[j][g]));
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

#include "kernels/woq_rows_impl.h"

constexpr WoqKernels kTable{"avx512", &gemv_s8, &gemv_u4};

}  // namespace

const WoqKernels& woq_kernels_avx512() { return kTable; }

}  // namespace qbackend::kernels
