// AVX512 weight-only int8 products (woq_kernels.h): the four output channels of a row tile by up to
// four rows of x per pass, 16 weights a step (sign-extended, converted to float32, one FMA per row), the K tail
// masked. Only this file is compiled for AVX512 with FMA (pragma below, after the includes).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_kernels.h"

QB_TARGET(QB_ISA_AVX512_FMA)
// GCC 12's false -Wmaybe-uninitialized inside the intrinsics headers (see avx512_common.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace qbackend::kernels {
namespace {

template <int MR>
void pass(const float* x, int64_t ldx, const int8_t* tile, int64_t K, float acc_out[MR][4]) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  // one 64-byte line of the tile a step: 16 weights of each row (zero beyond K, where x is masked)
  for (int64_t k = 0; k < K; k += 16, tile += WeightTiles::kLine) {
    prefetch_weights(tile);
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    __m512 wv[4];
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 16 * j))));
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

// The nibbles of `nbytes` bytes (at most 16; the rest read as 0) as floats in k order: the first 16
// in lo, the next 16 in hi.
inline void nibbles(const uint8_t* p, int64_t nbytes, __m512* lo, __m512* hi) {
  const __m128i b = _mm_maskz_loadu_epi8(__mmask16((1u << nbytes) - 1), p);
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i l = _mm_and_si128(b, low), h = _mm_and_si128(_mm_srli_epi16(b, 4), low);
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(l, h)));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(l, h)));
}

inline __mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Group by group (the scale and offset of each row broadcast once), 32 weights a step: one 16-byte
// chunk per row and step (8 bytes where G is 16), dequantized by one FMA per 16.
template <int MR>
void pass4(const float* x, int64_t ldx, const uint8_t* tile, const float* st, const float* ot, int64_t K, int64_t G,
           float acc_out[MR][4]) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    __m512 s[4], o[4];
    for (int j = 0; j < 4; ++j) {
      s[j] = _mm512_set1_ps(st[4 * g + j]);
      o[j] = _mm512_set1_ps(ot[4 * g + j]);
    }
    const int64_t k1 = std::min(K, k0 + G);
    for (int64_t k = k0; k < k1; k += 32) {
      const int64_t left = k1 - k;
      const int64_t nbytes = std::min<int64_t>(16, (left + 1) / 2);
      __m512 wlo[4], whi[4];
      prefetch_weights(WeightTiles::at(tile, 0, k / 2));  // the step's line (half of it where G is 16)
      for (int j = 0; j < 4; ++j) {
        nibbles(WeightTiles::at(tile, j, k / 2), nbytes, &wlo[j], &whi[j]);  // within one chunk
        wlo[j] = _mm512_fmadd_ps(wlo[j], s[j], o[j]);
        whi[j] = _mm512_fmadd_ps(whi[j], s[j], o[j]);
      }
      const __mmask16 mlo = lanes(left), mhi = lanes(left - 16 > 0 ? left - 16 : 0);
      for (int i = 0; i < MR; ++i) {
        const __m512 xlo = _mm512_maskz_loadu_ps(mlo, x + i * ldx + k);
        const __m512 xhi = _mm512_maskz_loadu_ps(mhi, x + i * ldx + k + 16);
        for (int j = 0; j < 4; ++j) {
          acc[i][j] = _mm512_fmadd_ps(xlo, wlo[j], acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(xhi, whi[j], acc[i][j]);
        }
      }
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
