// The native depthwise conv (contract: depthwise_kernels.h) on AVX2 CPUs without VNNI, exact at 8
// bits. Each input row a thread needs is laid out once into a ring of int32 rows of tap pairs,
// padded in both directions: lane (col, c) holds the int16 pair (v[col][c], v[col + dw][c]), v =
// xu - xu_zp (xu the uint8 view of x) in column col - pw of the image and 0 in the padding, so the
// taps read no zero point and the sums need no colsum correction. Two taps (kw, kw + 1) of 8
// channels are then one vpmaddwd of the pair lanes at column ow * sw + kw * dw against the
// filter's pair lanes (w32: w[kw] low, w[kw + 1] high, 0 past KW; |v * w| <= 255 * 128, the pair's
// sum exact in int32) and one vpaddd; blocks of 4 output pixels x 16 channels keep 8 accumulators
// in registers. Integer outputs without a residual are requantized with per-channel terms worked
// out once per call, the others by the GEMM's 256-bit epilogue (gemm_avx2_vnni_impl.h); both give
// the GEMM's bytes. 3 x 3 kernels have their tap loop unrolled. Call only when has(Isa::Avx2).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/depthwise_kernels.h"
#include "cpu/targets.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

constexpr int kPixels = 4;  // output pixels per block

// Columns of a pair row: the left padding, the image, and what the last output column's taps
// reach past it (every pair starts at a column a tap reads).
int64_t pair_cols(const DepthwiseArgs& a) {
  return std::max(a.W + a.pw, (a.OW - 1) * a.sw + (a.KW - 1) * a.dw + 1);
}
int64_t pair_lanes(const DepthwiseArgs& a) { return pair_cols(a) * depthwise_cp(a.C); }

// 16 channels of input column iw as int16 xu - xu_zp (I8: int8 bytes read as x ^ 0x80).
template <bool I8>
__attribute__((always_inline)) inline __m256i widened16(const uint8_t* s, __m256i vzp) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  if constexpr (I8) b = _mm_xor_si128(b, _mm_set1_epi8(static_cast<char>(0x80)));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(b), vzp);
}

// Input row (n, ih) as tap pairs: dst [pair_cols][Cp] int32, lane (col, c) = (v[col][c],
// v[col + dw][c]) as int16 (low, high), v = xu - xu_zp at image column col - pw, 0 outside the
// image and past C.
template <bool I8>
void pair_row(const DepthwiseArgs& a, int64_t n, int64_t ih, int32_t* dst) {
  const int64_t C = a.C, Cp = depthwise_cp(C), cols = pair_cols(a);
  const uint8_t* src = a.x + (n * a.H + ih - a.x_row0) * a.W * C;
  const int32_t zp = a.x_zp + (I8 ? 128 : 0);
  const __m256i vzp = _mm256_set1_epi16(static_cast<int16_t>(zp));
  const int64_t whole = C / 16 * 16;
  auto v = [&](int64_t iw, int64_t c) -> int32_t {  // one value, 0 outside the image
    if (iw < 0 || iw >= a.W) return 0;
    return static_cast<int32_t>(static_cast<uint8_t>(src[iw * C + c] ^ (I8 ? 0x80 : 0))) - zp;
  };
  for (int64_t col = 0; col < cols; ++col) {
    const int64_t ia = col - a.pw, ib = ia + a.dw;
    const bool va = ia >= 0 && ia < a.W, vb = ib >= 0 && ib < a.W;
    int32_t* d = dst + col * Cp;
    if (!va && !vb) {
      std::memset(d, 0, static_cast<size_t>(Cp) * sizeof(int32_t));
      continue;
    }
    int64_t c = 0;
    for (; c < whole; c += 16) {
      const __m256i x0 = va ? widened16<I8>(src + ia * C + c, vzp) : _mm256_setzero_si256();
      const __m256i x1 = vb ? widened16<I8>(src + ib * C + c, vzp) : _mm256_setzero_si256();
      // unpack within 128-bit lanes: lo = channels 0-3 | 8-11, hi = 4-7 | 12-15
      const __m256i lo = _mm256_unpacklo_epi16(x0, x1), hi = _mm256_unpackhi_epi16(x0, x1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    for (; c < C; ++c)
      d[c] = static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(v(ib, c))) << 16) |
                                  static_cast<uint16_t>(v(ia, c)));
    for (; c < Cp; ++c) d[c] = 0;
  }
}

// The requantizing epilogue's terms (integer output, no gelu, no residual: the GEMM epilogue's
// folded form), worked out once per call: per channel s2 = w_scale * x_scale * (1 / out_scale) and
// b2 = bias * (1 / out_scale), in the GEMM epilogue's order of operations (so the same bytes), and
// the clamp bounds relative to out_zp. Other outputs take the GEMM epilogue itself.
struct Terms {
  bool fast = false;
  bool u8 = false;
  const float* s2 = nullptr;
  const float* b2 = nullptr;
  __m256 q_lo, q_hi;
  __m256i out_zp;
};

Terms make_terms(const GemmArgs& g, int64_t Cp, float* buf) {
  Terms t;
  t.fast = requantizes_without_gelu(g) && !g.r;
  if (!t.fast) return t;
  t.u8 = g.out_type == GemmOut::u8;
  float* s2 = buf;
  float* b2 = buf + Cp;
  const float inv = g.out_inv_scale;
  for (int64_t c = 0; c < Cp; ++c) {  // as the GEMM epilogue: scale = w_scale * x_scale, bias 0 if none
    const bool real = c < g.N;
    const float scale = real ? g.w_scales[c] * g.x_scale : 0.0f;
    const float bias = real && g.bias ? g.bias[c] : 0.0f;
    s2[c] = scale * inv;
    b2[c] = bias * inv;
  }
  t.s2 = s2;
  t.b2 = b2;
  const float q_min = t.u8 ? 0.0f : -128.0f, q_max = t.u8 ? 255.0f : 127.0f;
  const float lo = q_min - static_cast<float>(g.out_zp);
  t.q_lo = _mm256_set1_ps(g.post == GemmPost::relu ? std::max(lo, 0.0f) : lo);
  t.q_hi = _mm256_set1_ps(q_max - static_cast<float>(g.out_zp));
  t.out_zp = _mm256_set1_epi32(g.out_zp);
  return t;
}

// Requantizes MR pixels x 16 channels (acc[r * 2 + h]) with the call's terms and stores them as
// bytes: clamp(round(acc * s2 + b2)) + out_zp per lane as the GEMM epilogue, then both halves
// packed to 16 bytes (exact: the values lie in the output's range).
template <int MR>
__attribute__((always_inline)) inline void store_requantized(const GemmArgs& g, const Terms& t, const __m256i* acc,
                                                             int64_t m0, int64_t c0) {
  const __m256 s2a = _mm256_loadu_ps(t.s2 + c0), s2b = _mm256_loadu_ps(t.s2 + c0 + 8);
  const __m256 b2a = _mm256_loadu_ps(t.b2 + c0), b2b = _mm256_loadu_ps(t.b2 + c0 + 8);
  const int64_t valid = std::min<int64_t>(16, g.N - c0);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m256 ya = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r * 2]), s2a, b2a);
    const __m256 yb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r * 2 + 1]), s2b, b2b);
    const __m256i qa = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(ya, t.q_lo), t.q_hi)), t.out_zp);
    const __m256i qb = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(yb, t.q_lo), t.q_hi)), t.out_zp);
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(qa, qb), 0xD8);  // qa[0..8), qb[0..8)
    const __m128i lo = _mm256_castsi256_si128(w16), hi = _mm256_extracti128_si256(w16, 1);
    const __m128i bytes = t.u8 ? _mm_packus_epi16(lo, hi) : _mm_packs_epi16(lo, hi);
    uint8_t* dst = static_cast<uint8_t*>(g.out) + (m0 + r) * g.ldc + c0;
    if (valid == 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bytes);
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), bytes);
      std::memcpy(dst, tmp, static_cast<size_t>(valid));
    }
  }
}

// MR output pixels (ow0.., pixel index m0..) x 16 channels (c0..) of one output row whose pair
// input rows are rows[0 .. KH). K3: a 3 x 3 kernel (its tap loop unrolled).
template <int MR, bool K3>
void block(const DepthwiseArgs& a, const GemmArgs& g, const Terms& t, const int32_t* const* rows, int64_t m0,
           int64_t ow0, int64_t c0) {
  const int64_t Cp = depthwise_cp(a.C);
  const int64_t KH = K3 ? 3 : a.KH, P = K3 ? 2 : depthwise_pairs(a.KW);
  const int64_t step = a.sw * Cp;  // lanes between the pixels of the block
  __m256i acc[MR * 2];
#pragma GCC unroll 8
  for (int i = 0; i < MR * 2; ++i) acc[i] = _mm256_setzero_si256();
#pragma GCC unroll 3
  for (int64_t kh = 0; kh < KH; ++kh) {
#pragma GCC unroll 2
    for (int64_t kp = 0; kp < P; ++kp) {  // taps 2 kp and 2 kp + 1
      const int32_t* wp = a.w32 + (kh * P + kp) * Cp + c0;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 8));
      const int32_t* xp = rows[kh] + (ow0 * a.sw + 2 * kp * a.dw) * Cp + c0;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i* p = reinterpret_cast<const __m256i*>(xp + r * step);
        acc[r * 2] = _mm256_add_epi32(acc[r * 2], _mm256_madd_epi16(_mm256_loadu_si256(p), w0));
        acc[r * 2 + 1] = _mm256_add_epi32(acc[r * 2 + 1], _mm256_madd_epi16(_mm256_loadu_si256(p + 1), w1));
      }
    }
  }
  if (t.fast) store_requantized<MR>(g, t, acc, m0, c0);
  else epilogue<MR>(g, acc, m0, c0);
}

template <bool K3>
void row_pixels(const DepthwiseArgs& a, const GemmArgs& g, const Terms& t, const int32_t* const* rows,
                int64_t m_row) {
  const int64_t Cp = depthwise_cp(a.C);
  int64_t ow = 0;
  for (; ow + kPixels <= a.OW; ow += kPixels)
    for (int64_t c0 = 0; c0 < Cp; c0 += 16) block<kPixels, K3>(a, g, t, rows, m_row + ow, ow, c0);
  for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
    switch (a.OW - ow) {
      case 3: block<3, K3>(a, g, t, rows, m_row + ow, ow, c0); break;
      case 2: block<2, K3>(a, g, t, rows, m_row + ow, ow, c0); break;
      case 1: block<1, K3>(a, g, t, rows, m_row + ow, ow, c0); break;
      default: break;
    }
  }
}

}  // namespace

size_t depthwise_scratch_bytes_avx2(const DepthwiseArgs& a) {
  // the ring of pair rows, a row of zeros (the padding rows), the epilogue's two [Cp] terms and
  // the ring's tags
  return static_cast<size_t>((depthwise_ring_rows(a) + 1) * pair_lanes(a) + 2 * depthwise_cp(a.C)) * sizeof(int32_t) +
         static_cast<size_t>(depthwise_ring_rows(a)) * sizeof(int64_t);
}

void depthwise_rows_avx2(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, uint8_t* scratch) {
  const int64_t lanes = pair_lanes(a), R = depthwise_ring_rows(a);
  int32_t* ring = reinterpret_cast<int32_t*>(scratch);
  int32_t* zero_row = ring + R * lanes;
  bool zero_row_filled = false;
  float* term_buf = reinterpret_cast<float*>(zero_row + lanes);
  int64_t* tags = reinterpret_cast<int64_t*>(term_buf + 2 * depthwise_cp(a.C));  // the n * H + ih a slot holds
  if (!a.keep_rings) std::fill(tags, tags + R, int64_t(-1));                   // (-1: none)
  // The sums are zero-point corrected already: the epilogue subtracts nothing.
  GemmArgs g = a.epi;
  g.a_zp = 0;
  const Terms t = make_terms(g, depthwise_cp(a.C), term_buf);
  const int32_t* rows[64];
  const bool k3 = a.KH == 3 && a.KW == 3;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / a.OH, oh = row % a.OH;
    depthwise_input_rows(a, n, oh, ring, lanes, tags, zero_row, uint8_t{0}, zero_row_filled,
                         [&](int64_t ih, int32_t* buf) {
                           if (a.x_int8) pair_row<true>(a, n, ih, buf);
                           else pair_row<false>(a, n, ih, buf);
                         }, rows);
    if (k3) row_pixels<true>(a, g, t, rows, row * a.OW - a.out_pixel0);
    else row_pixels<false>(a, g, t, rows, row * a.OW - a.out_pixel0);
  }
}

}  // namespace qbackend::kernels
