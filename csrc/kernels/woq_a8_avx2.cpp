// AVX2 W4A8 and W8A8 products (woq_a8_kernels.h). W4A8: 64 k of four weight rows a step; the nibbles (u <= 15) times
// the int8 activations by vpmaddubsw, whose 16-bit pair sums cannot saturate here (2 x 15 x 128 for
// each of the even and the odd k), then vpmaddwd into the exact int32 sum of each 8 k, scaled per lane
// into float32. Only this file is compiled for AVX2 with FMA.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_a8_kernels.h"

QB_TARGET(QB_ISA_AVX2)

namespace qbackend::kernels {
namespace {

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// Bytes [b0, b0 + 32) of row j of a row tile (b0 a multiple of 32): two 16-byte chunks, the second
// zero where the row's `row_bytes` end before it (the tile's padding is zero already).
template <typename T>
inline __m256i two_chunks(const T* tile, int j, int64_t b0, int64_t row_bytes) {
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(WeightTiles::at(tile, j, b0)));
  const __m128i second = b0 + 16 < row_bytes
                             ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(WeightTiles::at(tile, j, b0 + 16)))
                             : _mm_setzero_si128();
  return _mm256_inserti128_si256(_mm256_castsi128_si256(first), second, 1);
}

template <int MR>
void pass_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* tile, const float* st, const float* ot, int64_t K,
             int64_t G, float acc_out[MR][4]) {
  const int64_t nbytes = (K + 1) / 2, ng = q.ng;
  const int sh = __builtin_ctzll(uint64_t(G));
  const __m128i shift = _mm_cvtsi32_si128(sh);
  const __m256i lane_k = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nbytes; b0 += 32) {
    const int64_t k0 = 2 * b0;
    // each lane's weight group g (lanes beyond the last group masked off) and row j's scale st[4 g + j]
    const __m256i g = _mm256_srl_epi32(_mm256_add_epi32(_mm256_set1_epi32(int(k0)), lane_k), shift);
    const __m256 gmask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(ng)), g));
    __m256i lo[4], hi[4];
    __m256 sv[4];
    prefetch_weights(WeightTiles::at(tile, 0, b0));
    prefetch_weights(WeightTiles::at(tile, 0, b0 + 16));
    // the offset tile's line of this step's first group, into L1 for add_group_offsets after the
    // pass (the weights' prefetch does not cover the offset tile)
    _mm_prefetch(reinterpret_cast<const char*>(ot + 4 * (k0 >> sh)), _MM_HINT_T0);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = two_chunks(tile, j, b0, nbytes);
      lo[j] = _mm256_and_si256(v, low);
      hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      const __m256i idx = _mm256_add_epi32(_mm256_slli_epi32(g, 2), _mm256_set1_epi32(j));
      sv[j] = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), st, idx, gmask, 4);
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t row = m0 + i;
      const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.even + row * q.ldq + b0));
      const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.odd + row * q.ldq + b0));
      const __m256 d = _mm256_loadu_ps(q.lane_scale + row * q.ldl + b0 / 4);
      for (int j = 0; j < 4; ++j) {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], xe), _mm256_maddubs_epi16(hi[j], xo));
        const __m256i s = _mm256_madd_epi16(p, ones);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sv[j], d), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = hsum(acc[i][j]);
}

// One block of 32 k of four int8 weight rows a step: both operands sign-extended to 16 bits and
// multiplied by vpmaddwd (exact for every int8, -128 included), the block's sums scaled by its d.
template <int MR>
void pass_s8a8(const BlockQuantizedRows8& q, int64_t m0, const int8_t* tile, int64_t K, float acc_out[MR][4]) {
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    __m256i wl[4], wh[4];
    prefetch_weights(WeightTiles::at(tile, 0, k0));
    prefetch_weights(WeightTiles::at(tile, 0, k0 + 16));
    for (int j = 0; j < 4; ++j) {
      const __m256i v = two_chunks(tile, j, k0, K);
      wl[j] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
      wh[j] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t row = m0 + i;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.xq + row * q.ldq + k0));
      const __m256i xl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xv));
      const __m256i xh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xv, 1));
      const __m256 d = _mm256_set1_ps(q.lane_scale[row * q.ldl + k0 / 4]);
      for (int j = 0; j < 4; ++j) {
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(wl[j], xl), _mm256_madd_epi16(wh[j], xh));
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = hsum(acc[i][j]);
}

constexpr int kS8A8Tiles = 1;  // a tile a pass: AVX2's 16 registers hold no more
constexpr bool kPassA8Offsets = false;  // add_group_offsets adds them (pass_a8 prefetches them)

#include "kernels/woq_a8_rows_impl.h"

constexpr WoqA8Kernels kTable{"avx2", &quantize_row4_scalar, &quantize_row8_scalar, &gemv_u4a8, &gemv_s8a8};

}  // namespace

const WoqA8Kernels& woq_a8_kernels_avx2() { return kTable; }

}  // namespace qbackend::kernels
