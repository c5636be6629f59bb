// AVX512-VNNI W4A8 and W8A8 products (woq_a8_kernels.h): a 64-byte line of a row tile a step, all four
// rows in one register. Only this file is compiled for AVX512-VNNI.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/weight_prefetch.h"
#include "kernels/woq_a8_kernels.h"

QB_TARGET(QB_ISA_AVX512_VNNI QB_ISA_F16C)

#include "kernels/avx512_common.h"  // after the pragma: compiled for this target
#include "kernels/f16_lanes.h"

namespace qbackend::kernels {
namespace {

// A 64-byte line of a row tile holds 16 bytes of each of its four rows: as 16 int32 lanes, lane 4j + l
// holds bytes 4l .. 4l + 3 of row j's chunk. Against the activations' matching 16 bytes broadcast to
// the four 128-bit quarters, one vpdpbusd gives every lane's 4-byte dot product of its row.

// The sums of each row's four lanes (acc lanes 4j .. 4j + 3 -> out[j]).
inline void row_sums(__m512 acc, float out[4]) {
  alignas(64) float v[16];
  _mm512_store_ps(v, acc);
  for (int j = 0; j < 4; ++j) out[j] = (v[4 * j] + v[4 * j + 1]) + (v[4 * j + 2] + v[4 * j + 3]);
}

// W4A8: a line a step (32 k of each row, one activation block); the nibbles split by two masks into the
// even and the odd k, each multiplied with the matching int8 activations by one vpdpbusd (u8 x s8, exact
// int32 sums of each 8 k), then scaled per lane (weight group scale x the block's activation scale)
// into float32. Two lines an iteration, into two accumulators. Each group's offsets (the four rows' in
// one 128-bit vector) times the row's group sum go into a third accumulator as the pass reaches the
// group, so the offset tile is read beside the weights (a separate pass over it misses the cache:
// the weights' prefetch does not cover it).
template <int MR>
void pass_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* tile, const F16* st, const F16* ot, int64_t K,
             int64_t G, float acc_out[MR][4]) {
  const int64_t nbytes = (K + 1) / 2;
  const int shift = __builtin_ctzll(uint64_t(G));
  const __m512i row_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int8_t* xe[MR];
  const int8_t* xo[MR];
  const float* d[MR];
  const float* gs[MR];
  __m128 off[MR];
  for (int i = 0; i < MR; ++i) {
    xe[i] = q.even + (m0 + i) * q.ldq;
    xo[i] = q.odd + (m0 + i) * q.ldq;
    d[i] = q.lane_scale + (m0 + i) * q.ldl;
    gs[i] = q.group_sum + (m0 + i) * q.ng;
    off[i] = _mm_setzero_ps();
  }
  const auto add_offsets = [&](int64_t g) {
    const __m128 o = f16x4(ot + 4 * g);
    for (int i = 0; i < MR; ++i) off[i] = _mm_fmadd_ps(o, _mm_set1_ps(gs[i][g]), off[i]);
  };
  // lane 4j + l's group scale of row j for the line at byte b0 (lanes l = 2, 3 hold k 16 .. 31 of the
  // line: the next group when G = 16), kept while the group lasts
  __m512 sv = _mm512_setzero_ps();
  int64_t g_last = -1;
  const auto group_scales = [&](int64_t b0) {
    const int64_t k0 = 2 * b0, g = k0 >> shift;
    if (g != g_last) {
      sv = _mm512_permutexvar_ps(row_of_lane, _mm512_castps128_ps512(f16x4(st + 4 * g)));
      add_offsets(g);
      if (G == 16 && k0 + 16 < K) {
        sv = _mm512_mask_permutexvar_ps(sv, __mmask16(0xCCCC), row_of_lane,
                                        _mm512_castps128_ps512(f16x4(st + 4 * g + 4)));
        add_offsets(g + 1);
      }
      g_last = g;
    }
    return sv;
  };
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const auto line = [&](const uint8_t* t, int64_t b0, __m512 scales, int u) {
    prefetch_weights(t);
    const __m512i v = _mm512_loadu_si512(t);
    const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    for (int i = 0; i < MR; ++i) {
      const __m512i a = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xe[i] + b0)));
      const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xo[i] + b0)));
      const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a), hi, b);
      // every lane of the line lies in one activation block: one scale d
      acc[i][u] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scales, _mm512_set1_ps(d[i][b0 / 4])), acc[i][u]);
    }
  };
  int64_t b0 = 0;
  for (; b0 + 32 <= nbytes; b0 += 32, tile += 2 * WeightTiles::kLine) {
    line(tile, b0, group_scales(b0), 0);
    line(tile + WeightTiles::kLine, b0 + 16, group_scales(b0 + 16), 1);
  }
  for (int u = 0; b0 < nbytes; b0 += 16, tile += WeightTiles::kLine, ++u) line(tile, b0, group_scales(b0), u);
  for (int i = 0; i < MR; ++i) {
    row_sums(_mm512_add_ps(acc[i][0], acc[i][1]), acc_out[i]);
    alignas(16) float o[4];
    _mm_store_ps(o, off[i]);
    for (int j = 0; j < 4; ++j) acc_out[i][j] += o[j];
  }
}

// W8A8: a block of 32 k a step, the tile's two lines of it (16 k of each row each); the sign bit flipped
// makes the weights w + 128 (u8), whose products with xq vpdpbusd sums per 4 k into sums started at
// the block's -128 * sum(xq) per lane (q.block_offset), leaving the exact sum of w * xq, then scaled by
// the block's d into float32. Beyond K the tile holds 0 (128 after the flip) against xq = 0.
template <int MR>
void pass_s8a8(const BlockQuantizedRows8& q, int64_t m0, const int8_t* tile, int64_t K, float acc_out[MR][4]) {
  const __m512i flip = _mm512_set1_epi8(int8_t(0x80));
  const int8_t* x[MR];
  const float* d[MR];
  const int32_t* off[MR];
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) {
    x[i] = q.xq + (m0 + i) * q.ldq;
    d[i] = q.lane_scale + (m0 + i) * q.ldl;
    off[i] = q.block_offset + (m0 + i) * q.ldo;
    acc[i] = _mm512_setzero_ps();
  }
  for (int64_t k0 = 0; k0 < K; k0 += 32, tile += 2 * WeightTiles::kLine) {
    prefetch_weights(tile);
    prefetch_weights(tile + WeightTiles::kLine);
    const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(tile), flip);
    // the block's second line, where the tile has it (else xq is 0 there)
    const __m512i w1 = k0 + 16 < K ? _mm512_xor_si512(_mm512_loadu_si512(tile + WeightTiles::kLine), flip) : flip;
    for (int i = 0; i < MR; ++i) {
      __m512i s = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(off[i] + k0 / 8)));
      s = _mm512_dpbusd_epi32(s, w0, _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i] + k0))));
      s = _mm512_dpbusd_epi32(s, w1,
                              _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i] + k0 + 16))));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d[i][k0 / 4]), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) row_sums(acc[i], acc_out[i]);
}

// pass_s8a8 over NT consecutive row tiles (tile_bytes apart) at once: each block of 32 k loads each
// row's activations, scale and offsets once for all NT tiles; every row's and tile's sum takes the same
// steps in the same order as pass_s8a8's, so the results are pass_s8a8's bit for bit. MR x NT float
// accumulators stay in registers (16 of AVX512's 32 at 4 x 4).
template <int MR, int NT>
void pass_s8a8_tiles(const BlockQuantizedRows8& q, int64_t m0, const int8_t* tile, int64_t tile_bytes, int64_t K,
                     float acc_out[NT][MR][4]) {
  const __m512i flip = _mm512_set1_epi8(int8_t(0x80));
  const int8_t* x[MR];
  const float* d[MR];
  const int32_t* off[MR];
  __m512 acc[NT][MR];
  for (int i = 0; i < MR; ++i) {
    x[i] = q.xq + (m0 + i) * q.ldq;
    d[i] = q.lane_scale + (m0 + i) * q.ldl;
    off[i] = q.block_offset + (m0 + i) * q.ldo;
    for (int t = 0; t < NT; ++t) acc[t][i] = _mm512_setzero_ps();
  }
  for (int64_t k0 = 0; k0 < K; k0 += 32, tile += 2 * WeightTiles::kLine) {
    const bool second = k0 + 16 < K;
    __m512i w0[NT], w1[NT];
    for (int t = 0; t < NT; ++t) {
      prefetch_weights(tile + t * tile_bytes);
      prefetch_weights(tile + t * tile_bytes + WeightTiles::kLine);
      w0[t] = _mm512_xor_si512(_mm512_loadu_si512(tile + t * tile_bytes), flip);
      w1[t] = second ? _mm512_xor_si512(_mm512_loadu_si512(tile + t * tile_bytes + WeightTiles::kLine), flip)
                     : flip;
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i o = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(off[i] + k0 / 8)));
      const __m512i a0 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i] + k0)));
      const __m512i a1 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i] + k0 + 16)));
      const __m512 di = _mm512_set1_ps(d[i][k0 / 4]);
      for (int t = 0; t < NT; ++t) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o, w0[t], a0), w1[t], a1);
        acc[t][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), di, acc[t][i]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < MR; ++i) row_sums(acc[t][i], acc_out[t][i]);
}

constexpr int kS8A8Tiles = 4;

#include "kernels/woq_a8_rows_impl.h"

// ---- Row quantizers: a block of 32 k as two 16-lane vectors (masked loads: lanes beyond K are zero).

struct Block32 {
  __m512i q0, q1;  // xq of k0 .. k0 + 15 and k0 + 16 .. k0 + 31 as int32 lanes (0 beyond K)
  float d;         // the block's scale
};

// fpclass categories QNaN, +infinity, -infinity and SNaN: the values that are not finite.
constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;

inline Block32 quantize_block(const float* x, int64_t n) {
  const __m512 v0 = _mm512_maskz_loadu_ps(avx512::tail_mask(n), x);
  const __m512 v1 = _mm512_maskz_loadu_ps(avx512::tail_mask(std::max<int64_t>(0, n - 16)), x + 16);
  const bool finite = (_mm512_fpclass_ps_mask(v0, kNotFinite) | _mm512_fpclass_ps_mask(v1, kNotFinite)) == 0;
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  Block32 b;
  b.d = finite ? amax / 127.0f : NAN;
  if (b.d > 0.0f) {  // every |x / d| rounds to at most 127, so the clamp of the shared formula never acts
    const __m512 dv = _mm512_set1_ps(b.d), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i zero = _mm512_setzero_si512();
    b.q0 = avx512::quantize(v0, dv, lo, hi, zero);
    b.q1 = avx512::quantize(v1, dv, lo, hi, zero);
  } else {
    b.q0 = b.q1 = _mm512_setzero_si512();
  }
  return b;
}

// The even and the odd k of 16 int32 lanes (|values| <= 127) as 8 bytes each.
inline void store_even_odd(__m512i q, int8_t* even, int8_t* odd) {
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i bytes = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), split);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(even), bytes);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(odd), _mm_unpackhi_epi64(bytes, bytes));
}

// The buffers hold whole blocks (ldq >= K rounded up to 64 bytes of k), so every block stores 32 k.
void quantize_row4(const float* x, int64_t K, int64_t G, int8_t* even, int8_t* odd, float* lane_scale,
                   float* group_sum) {
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const int64_t n = std::min<int64_t>(32, K - k0);
    const Block32 b = quantize_block(x + k0, n);
    store_even_odd(b.q0, even + k0 / 2, odd + k0 / 2);
    store_even_odd(b.q1, even + k0 / 2 + 8, odd + k0 / 2 + 8);
    alignas(64) int32_t q[32];
    _mm512_store_si512(q, b.q0);
    _mm512_store_si512(q + 16, b.q1);
    for (int64_t l = 0; 8 * l < n; ++l) {
      int32_t sum = 0;
      for (int j = 0; j < 8; ++j) sum += q[8 * l + j];
      lane_scale[k0 / 8 + l] = b.d;
      // a separate rounding of the product, as the scalar code (no fused multiply-add)
      volatile float product = b.d * float(sum);
      group_sum[(k0 + 8 * l) / G] += product;
    }
  }
}

void quantize_row8(const float* x, int64_t K, int8_t* xq, float* lane_scale, int32_t* block_offset) {
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const int64_t n = std::min<int64_t>(32, K - k0);
    const Block32 b = quantize_block(x + k0, n);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + k0), _mm512_cvtepi32_epi8(b.q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + k0 + 16), _mm512_cvtepi32_epi8(b.q1));
    alignas(64) int32_t s[16];
    _mm512_store_si512(s, _mm512_add_epi32(b.q0, b.q1));
    int32_t* bo = block_offset + k0 / 32 * 4;
    for (int l = 0; l < 4; ++l) bo[l] = -128 * (s[4 * l] + s[4 * l + 1] + s[4 * l + 2] + s[4 * l + 3]);
    if (n == 32) _mm256_storeu_ps(lane_scale + k0 / 4, _mm256_set1_ps(b.d));
    else
      for (int64_t l = 0; 4 * l < n; ++l) lane_scale[k0 / 4 + l] = b.d;
  }
}

constexpr WoqA8Kernels kTable{"avx512_vnni", &quantize_row4, &quantize_row8, &gemv_u4a8, &gemv_s8a8};

}  // namespace

const WoqA8Kernels& woq_a8_kernels_avx512_vnni() { return kTable; }

}  // namespace qbackend::kernels
