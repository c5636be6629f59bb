// AVX2 weight-only int8 products (woq_kernels.h): the four output channels of a row tile by up to four rows of x
// per pass, 8 weights a step (sign-extended, converted to float32, one FMA per row), the last
// K % 8 in float32 scalars. Only this file is compiled for AVX2 with FMA (pragma below).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_kernels.h"

QB_TARGET(QB_ISA_AVX2 QB_ISA_F16C)
#include "kernels/avx2_common.h"
#include "kernels/f16_lanes.h"

namespace qbackend::kernels {
namespace {

inline __m256 load_w8(const int8_t* p) {
  int64_t bits;
  std::memcpy(&bits, p, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bits)));
}

// acc[i][j] += x[i][k..k+8) * wv[j] for the MR rows of x.
template <int MR>
inline void fma_rows(const float* x, int64_t ldx, int64_t k, const __m256 wv[4], __m256 acc[MR][4]) {
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

template <int MR>
void pass(const float* x, int64_t ldx, const int8_t* tile, int64_t K, float out[MR][4]) {
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    if (k % 16 == 0) prefetch_weights(WeightTiles::at(tile, 0, k));
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = load_w8(WeightTiles::at(tile, j, k));  // half a chunk
    fma_rows<MR>(x, ldx, k, wv, acc);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) {
      float s = avx2::hsum(acc[i][j]);
      for (int64_t k = K8; k < K; ++k) s += x[i * ldx + k] * float(*WeightTiles::at(tile, j, k));
      out[i][j] = s;
    }
}

// 8 nibbles of 4 bytes as 8 floats in k order.
inline __m256 nibbles(const uint8_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  const __m128i b = _mm_cvtsi32_si128(bits);
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i u = _mm_unpacklo_epi8(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(u));
}

// 4-bit weights, 8 k a step: w = scale * u + offset (one FMA), one FMA per row of x. Up to two rows of x
// a pass, a row tile's line (16 bytes = 32 k of each of its four rows) is split into nibbles and
// interleaved into k order once per half line (1.2-1.4x at one row); three or four rows' 16
// accumulators leave no registers for that, so those passes take each step's nibbles from memory
// (0.93-0.96x with the lines). Every way gives the same floats: the same steps in the same order.
template <int MR>
void pass4(const float* x, int64_t ldx, const uint8_t* tile, const float* st, const float* ot, int64_t K, int64_t G,
           float out[MR][4]) {
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  if constexpr (MR >= 3) {
    for (int64_t k = 0; k < K8; k += 8) {
      const int64_t g = k / G;
      if (k % 32 == 0) prefetch_weights(WeightTiles::at(tile, 0, k / 2));
      __m256 wv[4];
      for (int j = 0; j < 4; ++j)
        wv[j] = _mm256_fmadd_ps(nibbles(WeightTiles::at(tile, j, k / 2)), _mm256_set1_ps(st[4 * g + j]),
                                _mm256_set1_ps(ot[4 * g + j]));
      fma_rows<MR>(x, ldx, k, wv, acc);
    }
  } else {
    const __m128i low = _mm_set1_epi8(0x0F);
    const uint8_t* line = tile;
    for (int64_t k0 = 0; k0 < K8; k0 += 32, line += WeightTiles::kLine) {
      prefetch_weights(line);
      for (int half = 0; half < 2; ++half) {
        // row j's u at k0 + 16 half .. + 15, one byte each in k order (the even k in the low nibbles)
        __m128i u[4];
        for (int j = 0; j < 4; ++j) {
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(line + j * WeightTiles::kChunk));
          const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
          u[j] = half ? _mm_unpackhi_epi8(lo, hi) : _mm_unpacklo_epi8(lo, hi);
        }
        for (int q = 0; q < 2; ++q) {
          const int64_t k = k0 + 16 * half + 8 * q;
          if (k >= K8) break;
          const int64_t g = k / G;
          __m256 wv[4];
          for (int j = 0; j < 4; ++j)
            wv[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q ? _mm_srli_si128(u[j], 8) : u[j])),
                                    _mm256_set1_ps(st[4 * g + j]), _mm256_set1_ps(ot[4 * g + j]));
          fma_rows<MR>(x, ldx, k, wv, acc);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) {
      float s = avx2::hsum(acc[i][j]);
      for (int64_t k = K8; k < K; ++k) {
        const uint8_t b = *WeightTiles::at(tile, j, k / 2);
        const int u = (k & 1) ? (b >> 4) : (b & 15);
        s += x[i * ldx + k] * std::fma(st[4 * (k / G) + j], float(u), ot[4 * (k / G) + j]);
      }
      out[i][j] = s;
    }
}

#include "kernels/woq_rows_impl.h"

constexpr WoqKernels kTable{"avx2", &gemv_s8, &gemv_u4};

}  // namespace

const WoqKernels& woq_kernels_avx2() { return kTable; }

}  // namespace qbackend::kernels
