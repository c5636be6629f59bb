// AVX2 W4A8 and W8A8 products (woq_a8_kernels.h). W4A8: the nibbles (u <= 15) times the int8 activations by
// vpmaddubsw, whose 16-bit pair sums cannot saturate here (2 x 15 x 128 for each of the even and the odd
// k), then vpmaddwd into the exact int32 sum of each 8 k, scaled per lane into float32. Only this file
// is compiled for AVX2 with FMA.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_a8_kernels.h"

QB_TARGET(QB_ISA_AVX2 QB_ISA_F16C)
#include "kernels/avx2_common.h"
#include "kernels/f16_lanes.h"

namespace qbackend::kernels {
namespace {

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

// W4A8: a line of the row tile a step (16 bytes = 32 k of each of its four rows, one activation block),
// two rows' chunks to a register (rows 0, 1 and rows 2, 3) against the block's even and odd activations
// in both halves: lanes 0-3 of a product hold the first row's exact sums of 8 k, lanes 4-7 the second's,
// each scaled by its row's group scale (two groups per line when G = 16: lanes 0-1 and 2-3) times the
// block's d into float32. The group scales are permuted once per group for all the pass's rows; each
// group's offsets (the four rows' in one 128-bit vector) times the row's group sum go into a third
// accumulator as the pass reaches the group, so the offset tile is read beside the weights.
template <int MR>
__attribute__((noinline)) void pass_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* tile, const F16* st,
                                       const F16* ot, int64_t K, int64_t G, float acc_out[MR][4]) {
  const int64_t chunks = WeightTiles::chunks((K + 1) / 2);
  const int shift = __builtin_ctzll(uint64_t(G));
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  // lane l of the rows-0-1 (2-3) register takes element idx[l] of the scales [group g | group g + 1]
  const __m256i idx01 = G == 16 ? _mm256_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5) : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i idx23 = G == 16 ? _mm256_setr_epi32(2, 2, 6, 6, 3, 3, 7, 7) : _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  const int8_t* xe[MR];
  const int8_t* xo[MR];
  const float* d[MR];
  const float* gs[MR];
  __m128 off[MR];
  __m256 acc01[MR], acc23[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    xe[i] = q.even + (m0 + i) * q.ldq;
    xo[i] = q.odd + (m0 + i) * q.ldq;
    d[i] = q.lane_scale + (m0 + i) * q.ldl;
    gs[i] = q.group_sum + (m0 + i) * q.ng;
    off[i] = _mm_setzero_ps();
    acc01[i] = acc23[i] = _mm256_setzero_ps();
  }
  __m256 s01 = _mm256_setzero_ps(), s23 = _mm256_setzero_ps();
  int64_t g_last = -1;
  for (int64_t c = 0; c < chunks; ++c, tile += WeightTiles::kLine) {
    const int64_t g = (32 * c) >> shift;
    if (g != g_last) {
      // the line's second half is the next group where G = 16 (and the line reaches it)
      const bool two = G == 16 && 32 * c + 16 < K;
      const __m256 s8 = two ? f16x8(st + 4 * g) : _mm256_set_m128(f16x4(st + 4 * g), f16x4(st + 4 * g));
      s01 = _mm256_permutevar8x32_ps(s8, idx01);
      s23 = _mm256_permutevar8x32_ps(s8, idx23);
      const __m128 o = f16x4(ot + 4 * g);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) off[i] = _mm_fmadd_ps(o, _mm_set1_ps(gs[i][g]), off[i]);
      if (two) {
        const __m128 o1 = f16x4(ot + 4 * g + 4);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) off[i] = _mm_fmadd_ps(o1, _mm_set1_ps(gs[i][g + 1]), off[i]);
      }
      g_last = g;
    }
    prefetch_weights(tile);
    const __m256i w01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile));
    const __m256i w23 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32));
    const __m256i lo01 = _mm256_and_si256(w01, low), hi01 = _mm256_and_si256(_mm256_srli_epi16(w01, 4), low);
    const __m256i lo23 = _mm256_and_si256(w23, low), hi23 = _mm256_and_si256(_mm256_srli_epi16(w23, 4), low);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xe[i] + 16 * c)));
      const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xo[i] + 16 * c)));
      const __m256 dd = _mm256_broadcast_ss(d[i] + 4 * c);
      const __m256i p01 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo01, a), _mm256_maddubs_epi16(hi01, b)), ones);
      const __m256i p23 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo23, a), _mm256_maddubs_epi16(hi23, b)), ones);
      acc01[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p01), _mm256_mul_ps(s01, dd), acc01[i]);
      acc23[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p23), _mm256_mul_ps(s23, dd), acc23[i]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    // lanes 0-3 / 4-7 of acc01: rows 0 / 1; of acc23: rows 2 / 3
    const __m256 h = _mm256_hadd_ps(acc01[i], acc23[i]);
    const __m256 h2 = _mm256_hadd_ps(h, h);  // low half: rows 0, 2; high half: rows 1, 3
    alignas(32) float v[8];
    alignas(16) float o[4];
    _mm256_store_ps(v, h2);
    _mm_store_ps(o, off[i]);
    acc_out[i][0] = v[0] + o[0], acc_out[i][1] = v[4] + o[1], acc_out[i][2] = v[1] + o[2], acc_out[i][3] = v[5] + o[3];
  }
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
    for (int j = 0; j < 4; ++j) acc_out[i][j] = avx2::hsum(acc[i][j]);
}

constexpr int kS8A8Tiles = 1;  // a tile a pass: AVX2's 16 registers hold no more

#include "kernels/woq_a8_rows_impl.h"

// ---- Row quantizers (woq_a8_kernels.h: the scalar ones' bytes and floats): a block of 32 k as four
// 8-lane vectors, lanes beyond K zero.

struct Block32 {
  __m256i q[4];  // xq of k0 + 8i .. k0 + 8i + 7 as int32 lanes (0 beyond K)
  float d;       // the block's scale
};

inline __m256 lanes_of(const float* x, int64_t n) {
  if (n >= 8) return _mm256_loadu_ps(x);
  if (n <= 0) return _mm256_setzero_ps();
  return _mm256_maskload_ps(x, avx2::lane_mask(n));
}

inline Block32 quantize_block(const float* x, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 largest = _mm256_set1_ps(3.40282347e38f);
  __m256 v[4], amax = _mm256_setzero_ps();
  bool finite = true;
  for (int i = 0; i < 4; ++i) {
    v[i] = lanes_of(x + 8 * i, n - 8 * i);
    const __m256 a = _mm256_and_ps(v[i], abs_mask);
    // |x| <= FLT_MAX is false for infinities and NaN (an ordered compare)
    finite = finite && _mm256_movemask_ps(_mm256_cmp_ps(a, largest, _CMP_LE_OQ)) == 0xFF;
    amax = _mm256_max_ps(amax, a);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  Block32 b;
  b.d = finite ? _mm_cvtss_f32(m) / 127.0f : NAN;
  if (b.d > 0.0f) {  // every |x / d| rounds to at most 127: the scalar conversion's value, no clamp needed
    const __m256 dv = _mm256_set1_ps(b.d);
    for (int i = 0; i < 4; ++i) b.q[i] = _mm256_cvtps_epi32(_mm256_div_ps(v[i], dv));
  } else {
    for (int i = 0; i < 4; ++i) b.q[i] = _mm256_setzero_si256();
  }
  return b;
}

// The block's 32 int8 values in k order.
inline __m256i block_bytes(const Block32& b) {
  const __m256i w01 = _mm256_packs_epi32(b.q[0], b.q[1]), w23 = _mm256_packs_epi32(b.q[2], b.q[3]);
  // packs work within 128-bit lanes: k 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31 as 4-byte groups
  const __m256i bytes = _mm256_packs_epi16(w01, w23);
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline int32_t lane_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// The buffers hold whole blocks (ldq >= K rounded up to 64 bytes of k), so every block stores 32 k.
void quantize_row4(const float* x, int64_t K, int64_t G, int8_t* even, int8_t* odd, float* lane_scale,
                   float* group_sum) {
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const int64_t n = std::min<int64_t>(32, K - k0);
    const Block32 b = quantize_block(x + k0, n);
    // per 128-bit lane: its 8 even k, then its 8 odd k; then the evens of both lanes, the odds of both
    const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(block_bytes(b), split), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(even + k0 / 2), _mm256_castsi256_si128(eo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(odd + k0 / 2), _mm256_extracti128_si256(eo, 1));
    for (int64_t l = 0; 8 * l < n; ++l) {
      lane_scale[k0 / 8 + l] = b.d;
      // a separate rounding of the product, as the scalar code (no fused multiply-add)
      volatile float product = b.d * float(lane_sum(b.q[l]));
      group_sum[(k0 + 8 * l) / G] += product;
    }
  }
}

void quantize_row8(const float* x, int64_t K, int8_t* xq, float* lane_scale, int32_t* block_offset) {
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const int64_t n = std::min<int64_t>(32, K - k0);
    const Block32 b = quantize_block(x + k0, n);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k0), block_bytes(b));
    // block_offset[4 b + l]: -128 x the sum over k = 4l .. 4l + 3 and 16 + 4l .. 16 + 4l + 3 of the block
    alignas(32) int32_t s[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_add_epi32(b.q[0], b.q[2]));
    alignas(32) int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi32(b.q[1], b.q[3]));
    int32_t* bo = block_offset + k0 / 32 * 4;
    for (int l = 0; l < 2; ++l) {
      bo[l] = -128 * (s[4 * l] + s[4 * l + 1] + s[4 * l + 2] + s[4 * l + 3]);
      bo[l + 2] = -128 * (t[4 * l] + t[4 * l + 1] + t[4 * l + 2] + t[4 * l + 3]);
    }
    for (int64_t l = 0; 4 * l < n; ++l) lane_scale[k0 / 4 + l] = b.d;
  }
}

constexpr WoqA8Kernels kTable{"avx2", &quantize_row4, &quantize_row8, &gemv_u4a8, &gemv_s8a8};

}  // namespace

const WoqA8Kernels& woq_a8_kernels_avx2() { return kTable; }

}  // namespace qbackend::kernels
