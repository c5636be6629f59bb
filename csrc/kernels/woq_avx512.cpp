// AVX512 weight-only int8 products (woq_kernels.h): the four output channels of a row tile by up to
// four rows of x per pass, 16 weights a step (sign-extended, converted to float32, one FMA per row), the K tail
// masked. Only this file is compiled for AVX512 with FMA (pragma below, after the includes).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_kernels.h"

QB_TARGET(QB_ISA_AVX512_FMA QB_ISA_F16C)

#include "kernels/f16_lanes.h"  // after the pragma: compiled for this target
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

// The nibbles of `nbytes` bytes (at most 16; the rest read as 0) as floats, lane l holding byte l's:
// the low nibbles (the chunk's even k) in *even, the high ones (its odd k) in *odd. One widening
// shuffle for 32 weights: unpacking them into k order took four.
inline void nibbles(const uint8_t* p, int64_t nbytes, __m512* even, __m512* odd) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(__mmask16((1u << nbytes) - 1), p));
  *even = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F)));
  *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}

inline __mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Group by group (the scale and offset of each row broadcast once), 32 weights a step: one 16-byte
// chunk per row and step (8 bytes where G is 16), its even and odd k dequantized by one FMA per 16,
// and each row of x split into the same even and odd k by two permutes (4 + 2 MR shuffles a step).
template <int MR>
void pass4(const float* x, int64_t ldx, const uint8_t* tile, const float* st, const float* ot, int64_t K, int64_t G,
           float acc_out[MR][4]) {
  const __m512i even_k = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_k = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
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
      __m512 we[4], wo[4];
      prefetch_weights(WeightTiles::at(tile, 0, k / 2));  // the step's line (half of it where G is 16)
      for (int j = 0; j < 4; ++j) {
        nibbles(WeightTiles::at(tile, j, k / 2), nbytes, &we[j], &wo[j]);  // within one chunk
        we[j] = _mm512_fmadd_ps(we[j], s[j], o[j]);
        wo[j] = _mm512_fmadd_ps(wo[j], s[j], o[j]);
      }
      // lanes past K read x as 0 (their weights dequantize to the offset)
      const __mmask16 mlo = lanes(left), mhi = lanes(left - 16 > 0 ? left - 16 : 0);
      for (int i = 0; i < MR; ++i) {
        const __m512 x0 = _mm512_maskz_loadu_ps(mlo, x + i * ldx + k);
        const __m512 x1 = _mm512_maskz_loadu_ps(mhi, x + i * ldx + k + 16);
        const __m512 xe = _mm512_permutex2var_ps(x0, even_k, x1), xo = _mm512_permutex2var_ps(x0, odd_k, x1);
        for (int j = 0; j < 4; ++j) {
          acc[i][j] = _mm512_fmadd_ps(xe, we[j], acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(xo, wo[j], acc[i][j]);
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
