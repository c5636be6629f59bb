// The native depthwise conv (contract: depthwise_kernels.h) on AVX512-VNNI, one block of 64
// channels at a time: each input row is laid out once per thread and block as tap rows (for every
// output column and 4-tap group, the 4 input bytes of each channel that the group reads, one int32
// lane per channel; a ring of the rows the current output row reads), then blocks of up to 8 output
// pixels x 64 channels accumulate one vpdpbusd per kernel row and tap group in int32 registers,
// starting from the zero point's share, and are requantized with per-channel terms worked out once
// per call (other outputs: the native GEMM's epilogue, gemm_avx512_vnni_impl.h). 3-row kernels of
// up to 4 taps a row have their loop unrolled. Call only when has(Isa::Avx512Vnni).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "kernels/depthwise_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512_VNNI)

#include "kernels/gemm_avx512_vnni_impl.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {
namespace {

// Input bytes a chunk of rows spans at most (unless one row is larger): what the channel blocks
// read in turn, kept within L2 (1-2 MB per core on the CPUs with AVX512-VNNI).
constexpr int64_t kChunkInputBytes = int64_t(192) << 10;

// Lanes a tap row holds per output column and group: one channel block's (64 channels, or all of
// them when fewer).
int64_t block_lanes(const DepthwiseArgs& a) { return std::min<int64_t>(64, depthwise_cp(a.C)); }
// int32 lanes of one tap row (one channel block's): [G][OW][block_lanes].
int64_t tap_row_lanes(const DepthwiseArgs& a) { return depthwise_groups(a.KW) * a.OW * block_lanes(a); }
int32_t uint8_zero_point(const DepthwiseArgs& a) { return a.x_zp + (a.x_int8 ? 128 : 0); }

// 16 channels of input column iw (c0.., `valid` of them) widened to int32 lanes, as uint8.
inline __m512i column(const DepthwiseArgs& a, const uint8_t* src, int64_t iw, int64_t c0, int64_t valid) {
  const uint8_t* s = src + iw * a.C + c0;
  const __m128i b = valid >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(s))
                                : _mm_maskz_loadu_epi8(avx512::tail_mask(valid), s);
  return _mm512_cvtepu8_epi32(b);
}

// Tap group lanes of an output column whose TAPS input columns base, base + dw, ... all lie inside
// the image: byte t of lane c = x[base + t * dw][c] (as uint8: int8 bytes with their sign bit flipped).
// Channels [cb, Cp) (the last block's), to dst[c - cb].
template <int TAPS, bool I8>
inline void interior_groups(const DepthwiseArgs& a, const uint8_t* src, int64_t base, int64_t cb, int32_t* dst) {
  const int64_t Cp = depthwise_cp(a.C);
  // The sign bits of the bytes of real taps (the other bytes weigh 0).
  const __m512i flip = _mm512_set1_epi32(static_cast<int32_t>(0x80808080u >> (8 * (4 - TAPS))));
  for (int64_t c0 = cb; c0 < Cp; c0 += 16) {
    const int64_t valid = a.C - c0;
    __m512i v = column(a, src, base, c0, valid);
    if constexpr (TAPS == 2) {
      v = _mm512_or_si512(v, _mm512_slli_epi32(column(a, src, base + a.dw, c0, valid), 8));
    } else if constexpr (TAPS >= 3) {
      v = _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(column(a, src, base + a.dw, c0, valid), 8),
                                    _mm512_slli_epi32(column(a, src, base + 2 * a.dw, c0, valid), 16), 0xFE);
      if constexpr (TAPS == 4) v = _mm512_or_si512(v, _mm512_slli_epi32(column(a, src, base + 3 * a.dw, c0, valid), 24));
    }
    if constexpr (I8) v = _mm512_xor_si512(v, flip);
    _mm512_storeu_si512(dst + (c0 - cb), v);
  }
}

template <bool I8>
void interior(const DepthwiseArgs& a, const uint8_t* src, int64_t base, int64_t taps, int64_t cb, int32_t* dst) {
  switch (taps) {
    case 1: interior_groups<1, I8>(a, src, base, cb, dst); break;
    case 2: interior_groups<2, I8>(a, src, base, cb, dst); break;
    case 3: interior_groups<3, I8>(a, src, base, cb, dst); break;
    default: interior_groups<4, I8>(a, src, base, cb, dst); break;
  }
}

// The same for an output column that reads padding: taps outside [0, W) read the zero point.
inline void border_groups(const DepthwiseArgs& a, const uint8_t* src, int64_t base, int64_t taps, int64_t cb,
                          int32_t* dst) {
  const int64_t Cp = depthwise_cp(a.C);
  const int32_t zp = uint8_zero_point(a);
  for (int64_t c0 = cb; c0 < Cp; c0 += 16) {
    __m512i v = _mm512_setzero_si512();
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t iw = base + t * a.dw;
      __m512i b;
      if (iw >= 0 && iw < a.W) {
        b = column(a, src, iw, c0, a.C - c0);
        if (a.x_int8) b = _mm512_xor_si512(b, _mm512_set1_epi32(0x80));
      } else {
        b = _mm512_set1_epi32(zp);
      }
      v = _mm512_or_si512(v, _mm512_sllv_epi32(b, _mm512_set1_epi32(static_cast<int>(8 * t))));
    }
    _mm512_storeu_si512(dst + (c0 - cb), v);
  }
}

// Stride 1, no dilation: the group lanes of output columns [ow0, ow1) of group g, whose 4 input
// columns base .. base + 3 all lie inside the image, by sliding: the lanes of column ow + 1 are
// those of ow shifted down one byte with input column base + 4 in the top byte (one widened load
// per output column instead of one per tap). Bytes beyond the group's taps weigh 0. Two columns a
// step: ow + 2 comes from ow (two bytes down, two new ones on top), so that the chain of shifts
// from column to column is half as long (its latency bounded the loop).
template <bool I8>
void slide_groups(const DepthwiseArgs& a, const uint8_t* src, int64_t g, int64_t ow0, int64_t ow1, int64_t cb,
                  int32_t* dst) {
  const int64_t C = a.C, Cp = depthwise_cp(C), BW = block_lanes(a);  // locals: the stores may alias a
  const __m512i flip1 = _mm512_set1_epi32(0x80);
  const int64_t base0 = ow0 - a.pw + 4 * g;
  int32_t* const d0 = dst + (g * a.OW + ow0) * BW;
  for (int64_t c0 = cb; c0 < Cp; c0 += 16) {
    const __mmask16 mask = avx512::tail_mask(std::min<int64_t>(16, C - c0));
    const uint8_t* in = src + base0 * C + c0;  // input column base0, channels c0..
    auto next = [&](int64_t k) {  // input column base0 + k, widened (as uint8)
      const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, in + k * C));
      if constexpr (I8) return _mm512_xor_si512(v, flip1);
      return v;
    };
    __m512i v = _mm512_ternarylogic_epi32(next(0), _mm512_slli_epi32(next(1), 8), _mm512_slli_epi32(next(2), 16),
                                          0xFE);
    v = _mm512_or_si512(v, _mm512_slli_epi32(next(3), 24));
    int32_t* d = d0 + (c0 - cb);
    for (int64_t k = 0;; k += 2) {  // v: column ow0 + k
      _mm512_storeu_si512(d, v);
      if (ow0 + k + 1 == ow1) break;
      const __m512i n4 = next(k + 4);
      _mm512_storeu_si512(d + BW, _mm512_or_si512(_mm512_srli_epi32(v, 8), _mm512_slli_epi32(n4, 24)));
      if (ow0 + k + 2 == ow1) break;
      v = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 16), _mm512_slli_epi32(n4, 16),
                                    _mm512_slli_epi32(next(k + 5), 24), 0xFE);
      d += 2 * BW;
    }
  }
}

// The lanes of a whole 64-channel block (channels c0..) of one output column and group: its 4
// input columns cols[0..4) (a column outside the image, or past the group's taps, is `pad`: bytes
// of the zero point in x's dtype) interleaved bytewise, which leaves the lanes in the interleaved
// order of depthwise_kernels.h.
template <bool I8>
inline void interleave_groups(const uint8_t* const* cols, int64_t c0, int32_t* dst) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i v[4];
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    v[t] = _mm512_loadu_si512(cols[t] + c0);
    if constexpr (I8) v[t] = _mm512_xor_si512(v[t], flip);
  }
  const __m512i ab_lo = _mm512_unpacklo_epi8(v[0], v[1]), ab_hi = _mm512_unpackhi_epi8(v[0], v[1]);
  const __m512i cd_lo = _mm512_unpacklo_epi8(v[2], v[3]), cd_hi = _mm512_unpackhi_epi8(v[2], v[3]);
  _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(ab_lo, cd_lo));
  _mm512_storeu_si512(dst + 16, _mm512_unpackhi_epi16(ab_lo, cd_lo));
  _mm512_storeu_si512(dst + 32, _mm512_unpacklo_epi16(ab_hi, cd_hi));
  _mm512_storeu_si512(dst + 48, _mm512_unpackhi_epi16(ab_hi, cd_hi));
}

// The same lanes for 3 taps at stride 2 without dilation (MobileNet's downsampling): the group of
// output column ow reads input columns 2 ow - pw + (0, 1, 2), and its 4th byte, whose weight is 0,
// takes column 2 ow - pw + 3 (pad outside the image) instead of the padding pixel, so that the
// byte pairs unpacked for columns (2 ow - pw + 2, + 3) serve ow and ow + 1: two loads and two byte
// unpacks per output column instead of four each.
template <bool I8>
void stride2_groups(const DepthwiseArgs& a, const uint8_t* src, int64_t cb, const uint8_t* pad, int32_t* dst) {
  const int64_t C = a.C, W = a.W, OW = a.OW;  // locals: the stores may alias a
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  auto column = [&](int64_t iw) {
    const __m512i v = _mm512_loadu_si512((iw >= 0 && iw < W ? src + iw * C : pad) + cb);
    if constexpr (I8) return _mm512_xor_si512(v, flip);
    return v;
  };
  int64_t iw = -a.pw;
  __m512i c0 = column(iw), c1 = column(iw + 1);
  __m512i lo = _mm512_unpacklo_epi8(c0, c1), hi = _mm512_unpackhi_epi8(c0, c1);
  for (int64_t ow = 0; ow < OW; ++ow, iw += 2, dst += 64) {
    c0 = column(iw + 2);
    c1 = column(iw + 3);
    const __m512i lo2 = _mm512_unpacklo_epi8(c0, c1), hi2 = _mm512_unpackhi_epi8(c0, c1);
    _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(lo, lo2));
    _mm512_storeu_si512(dst + 16, _mm512_unpackhi_epi16(lo, lo2));
    _mm512_storeu_si512(dst + 32, _mm512_unpacklo_epi16(hi, hi2));
    _mm512_storeu_si512(dst + 48, _mm512_unpackhi_epi16(hi, hi2));
    lo = lo2;
    hi = hi2;
  }
}

// Where each output column's tap groups read in an input row: [G][OW][4] byte offsets iw * C of
// the columns iw = ow * sw - pw + (4 g + t) * dw, or -1 for a column outside the image or past the
// group's taps (which reads the padding pixel). The same for every row and channel block.
void column_offsets(const DepthwiseArgs& a, int64_t* off) {
  const int64_t G = depthwise_groups(a.KW);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t taps = std::min<int64_t>(4, a.KW - 4 * g);
    for (int64_t ow = 0; ow < a.OW; ++ow) {
      for (int64_t t = 0; t < 4; ++t) {
        const int64_t iw = ow * a.sw - a.pw + (4 * g + t) * a.dw;
        *off++ = t < taps && iw >= 0 && iw < a.W ? iw * a.C : -1;
      }
    }
  }
}

// Channel block cb.. of input row (n, ih) as tap rows: dst [G][OW][block_lanes] int32 lanes.
// pad: at least C bytes of x's zero point; col_off: column_offsets.
void build_tap_row(const DepthwiseArgs& a, int64_t n, int64_t ih, int64_t cb, const uint8_t* pad,
                   const int64_t* col_off, int32_t* dst) {
  const int64_t BW = block_lanes(a), G = depthwise_groups(a.KW);
  const uint8_t* src = a.x + (n * a.H + ih - a.x_row0) * a.W * a.C;
  const bool slides = a.sw == 1 && a.dw == 1;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t taps = std::min<int64_t>(4, a.KW - 4 * g);
    if (cb + 64 <= a.C) {  // a whole block
      if (a.KW == 3 && a.sw == 2 && a.dw == 1) {
        if (a.x_int8) stride2_groups<true>(a, src, cb, pad, dst);
        else stride2_groups<false>(a, src, cb, pad, dst);
        continue;
      }
      const int64_t* off = col_off + g * a.OW * 4;
      for (int64_t ow = 0; ow < a.OW; ++ow, off += 4) {
        const uint8_t* cols[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) cols[t] = off[t] >= 0 ? src + off[t] : pad;
        if (a.x_int8) interleave_groups<true>(cols, cb, dst + (g * a.OW + ow) * BW);
        else interleave_groups<false>(cols, cb, dst + (g * a.OW + ow) * BW);
      }
      continue;
    }
    // the last channels, 16 at a time in their own order
    // with sliding: the output columns whose 4 group bytes (taps and filler) lie inside the image
    const int64_t s0 = slides && taps >= 2 ? std::max<int64_t>(0, a.pw - 4 * g) : a.OW;
    const int64_t s1 = slides && taps >= 2 ? std::min<int64_t>(a.OW, a.W - 3 + a.pw - 4 * g) : a.OW;
    for (int64_t ow = 0; ow < a.OW; ++ow) {
      if (ow == s0 && s1 - s0 >= 2) {
        if (a.x_int8) slide_groups<true>(a, src, g, s0, s1, cb, dst);
        else slide_groups<false>(a, src, g, s0, s1, cb, dst);
        ow = s1 - 1;
        continue;
      }
      const int64_t base = ow * a.sw - a.pw + 4 * g * a.dw;
      int32_t* d = dst + (g * a.OW + ow) * BW;
      if (base < 0 || base + (taps - 1) * a.dw >= a.W) {
        border_groups(a, src, base, taps, cb, d);
        continue;
      }
      if (a.x_int8) interior<true>(a, src, base, taps, cb, d);
      else interior<false>(a, src, base, taps, cb, d);
    }
  }
}

// The 4 vectors of a whole 64-channel block between lane order and channel order (either way: the
// lane order swaps the 128-bit block index with the vector index, a 4 x 4 transpose of blocks).
inline void transpose_blocks(__m512i* v) {
  const __m512i t0 = _mm512_shuffle_i32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_i32x4(v[0], v[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_i32x4(v[2], v[3], 0xEE);
  v[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
  v[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
  v[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
  v[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
}

// The epilogue's per-channel terms, worked out once per call for all of its output rows:
// init = -xu_zp x colsum, the accumulators' start (so the dot products end as the exact
// zero-point-corrected sums); and for the requantizing epilogue (integer output, no gelu, no
// residual) the GEMM's RequantColumn terms s2 and b2 of every channel, so the output is that
// epilogue's bit for bit.
struct Terms {
  const int32_t* init;
  const float* s2;
  const float* b2;
  bool requant;       // the requantizing epilogue applies
  RequantOutput out;  // its terms shared by every channel
  __m512i out_zp16;   // out_zp in every int16 lane
};

Terms make_terms(const DepthwiseArgs& a, uint8_t* buf) {
  const GemmArgs& g = a.epi;
  const int64_t Cp = depthwise_cp(a.C);
  int32_t* init = reinterpret_cast<int32_t*>(buf);
  float* s2 = reinterpret_cast<float*>(buf) + Cp;
  float* b2 = s2 + Cp;
  const __m512i neg_zp = _mm512_set1_epi32(-uint8_zero_point(a));
  for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
    _mm512_storeu_si512(init + c0, _mm512_mullo_epi32(_mm512_loadu_si512(g.colsum + c0), neg_zp));
    const RequantColumn col(g, c0, 0, true);
    _mm512_storeu_ps(s2 + c0, col.s2);
    _mm512_storeu_ps(b2 + c0, col.b2);
  }
  for (float* terms : {s2, b2}) {  // in lane order (colsum, and so init, is already)
    for (int64_t c0 = 0; c0 < depthwise_whole_blocks(a.C); c0 += 64) {
      __m512i v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm512_castps_si512(_mm512_loadu_ps(terms + c0 + 16 * i));
      transpose_blocks(v);
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(terms + c0 + 16 * i, _mm512_castsi512_ps(v[i]));
    }
  }
  return Terms{init, s2, b2,
               requantizes_without_gelu(g) && !g.r,
               RequantOutput(g), _mm512_set1_epi16(static_cast<int16_t>(g.out_zp))};
}

// Requantizes MR pixels x a whole 64-channel block (four vectors in lane order) and stores them as
// one 64-byte row each: per vector clamp(acc x s2 + b2) rounded to int32 as in requant_rows, then
// the four vectors packed to int16 (exact: the values lie within the bounds), out_zp added there
// (exact: the sums lie in the output's range) and packed to bytes. The packs interleave the vectors
// per 128-bit block, which puts lane order back into channel order.
// (Terms are read into locals first: the stores may alias them.)
template <int MR>
__attribute__((always_inline)) inline void store_packed(const DepthwiseArgs& a, const Terms& t, const __m512i* acc,
                                                        int64_t m0, int64_t c0) {
  __m512 s2[4], b2[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    s2[v] = _mm512_loadu_ps(t.s2 + c0 + v * 16);
    b2[v] = _mm512_loadu_ps(t.b2 + c0 + v * 16);
  }
  const __m512 q_lo = t.out.q_lo, q_hi = t.out.q_hi;
  const __m512i out_zp16 = t.out_zp16;
  const bool u8 = t.out.u8;
  const int64_t ldc = a.epi.ldc;
  uint8_t* const out = static_cast<uint8_t*>(a.epi.out) + m0 * ldc + c0;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m512i q[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r * 4 + v]), s2[v], b2[v]);
      q[v] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(y, q_lo), q_hi));
    }
    const __m512i lo = _mm512_adds_epi16(_mm512_packs_epi32(q[0], q[1]), out_zp16);
    const __m512i hi = _mm512_adds_epi16(_mm512_packs_epi32(q[2], q[3]), out_zp16);
    _mm512_storeu_si512(out + r * ldc, u8 ? _mm512_packus_epi16(lo, hi) : _mm512_packs_epi16(lo, hi));
  }
}

// The same requantization for MR pixels x NV vectors in channel order, the last maybe partial:
// the GEMM's requant_rows with the columns' terms of the call.
template <int MR, int NV>
__attribute__((always_inline)) inline void store_vectors(const DepthwiseArgs& a, const Terms& t, const __m512i* acc,
                                                         int64_t m0, int64_t c0) {
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t n0 = c0 + v * 16;
    RequantColumn col;
    col.mask = avx512::tail_mask(std::min<int64_t>(16, a.C - n0));
    col.zp_colsum = _mm512_setzero_si512();  // the sums start corrected (Terms::init)
    col.s2 = _mm512_loadu_ps(t.s2 + n0);
    col.b2 = _mm512_loadu_ps(t.b2 + n0);
    requant_rows<MR, NV>(a.epi, acc, v, m0, n0, col, t.out);
  }
}

// MR output pixels (ow0.., pixel index m0..) x NV 16-channel vectors (c0..) of one output row whose
// tap rows are rows[0 .. KH).
// KH3: the kernel is 3 x (up to 4) taps, its loop unrolled at compile time (with a runtime trip
// count the compiler rotates the accumulators through other registers on every iteration).
// BW: block_lanes(a), a compile-time constant so that the pixels' loads take constant offsets
// from one address per tap row.
template <int MR, int NV, bool KH3, int BW>
void block(const DepthwiseArgs& a, const Terms& t, const int32_t* const* rows, int64_t m0, int64_t ow0, int64_t c0) {
  const int64_t Cp = depthwise_cp(a.C);
  const int64_t KH = KH3 ? 3 : a.KH, G = KH3 ? 1 : depthwise_groups(a.KW);
  __m512i acc[MR * NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512i init = _mm512_loadu_si512(t.init + c0 + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r * NV + v] = init;
  }
#pragma GCC unroll 3
  for (int64_t kh = 0; kh < KH; ++kh) {
    for (int64_t g = 0; g < G; ++g) {
      const int32_t* q = rows[kh] + (g * a.OW + ow0) * BW;
      const int8_t* wp = a.w + ((kh * G + g) * Cp + c0) * 4;
      __m512i wv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_si512(wp + v * 64);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          acc[r * NV + v] = _mm512_dpbusd_epi32(acc[r * NV + v], _mm512_loadu_si512(q + r * BW + v * 16), wv[v]);
      }
    }
  }
  if constexpr (NV == 4) {
    if (c0 + 64 <= a.C) {  // a whole block, in lane order
      if (t.requant) return store_packed<MR>(a, t, acc, m0, c0);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) transpose_blocks(acc + 4 * r);
    }
  }
  if (t.requant) return store_vectors<MR, NV>(a, t, acc, m0, c0);
  epilogue<MR, NV>(a.epi, acc, m0, c0, 0);  // the sums are zero-point corrected already
}

// An output row's pixels [0, OW) for the channel block c0.. of nv vectors, in blocks of MR pixels.
// The last pixels of a row take one block of their number (a block reads the weights and the
// epilogue's terms once for all of its pixels).
template <int MR, int NV, bool KH3, int BW>
void pixels(const DepthwiseArgs& a, const Terms& t, const int32_t* const* rows, int64_t m_row, int64_t c0) {
  int64_t ow = 0;
  for (; ow + MR <= a.OW; ow += MR) block<MR, NV, KH3, BW>(a, t, rows, m_row + ow, ow, c0);
  if constexpr (MR > 4) {
    if (ow + 4 <= a.OW) {
      block<4, NV, KH3, BW>(a, t, rows, m_row + ow, ow, c0);
      ow += 4;
    }
  }
  switch (a.OW - ow) {
    case 3: block<3, NV, KH3, BW>(a, t, rows, m_row + ow, ow, c0); break;
    case 2: block<2, NV, KH3, BW>(a, t, rows, m_row + ow, ow, c0); break;
    case 1: block<1, NV, KH3, BW>(a, t, rows, m_row + ow, ow, c0); break;
    default: break;
  }
}

template <int MR, int NV>
void pixels(const DepthwiseArgs& a, const Terms& t, const int32_t* const* rows, int64_t m_row, int64_t c0) {
  // block_lanes: 64, or all channels (NV vectors) when fewer
  constexpr int kNarrow = 16 * NV;
  const bool narrow = a.C < 64;
  if (a.KH == 3 && a.KW <= 4) {
    if (narrow) pixels<MR, NV, true, kNarrow>(a, t, rows, m_row, c0);
    else pixels<MR, NV, true, 64>(a, t, rows, m_row, c0);
  } else {
    if (narrow) pixels<MR, NV, false, kNarrow>(a, t, rows, m_row, c0);
    else pixels<MR, NV, false, 64>(a, t, rows, m_row, c0);
  }
}

void row_pixels(const DepthwiseArgs& a, const Terms& t, const int32_t* const* rows, int64_t m_row, int64_t c0,
                int64_t nv) {
  switch (nv) {  // up to 16 accumulators
    case 1: pixels<8, 1>(a, t, rows, m_row, c0); break;
    case 2: pixels<8, 2>(a, t, rows, m_row, c0); break;
    case 3: pixels<4, 3>(a, t, rows, m_row, c0); break;
    default: pixels<4, 4>(a, t, rows, m_row, c0); break;
  }
}

}  // namespace

size_t depthwise_scratch_bytes(const DepthwiseArgs& a) {
  // a ring per channel block, the padding row, the epilogue's three [Cp] terms, a pixel of the zero
  // point, the column offsets and the rings' tags
  const int64_t blocks = (a.C + 63) / 64;
  return static_cast<size_t>((blocks * depthwise_ring_rows(a) + 1) * tap_row_lanes(a) + 3 * depthwise_cp(a.C)) *
             sizeof(int32_t) +
         static_cast<size_t>(depthwise_cp(a.C)) +
         static_cast<size_t>(depthwise_groups(a.KW) * a.OW * 4 + blocks * depthwise_ring_rows(a)) * sizeof(int64_t);
}

void depthwise_rows_avx512(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, uint8_t* scratch) {
  const int64_t lanes = tap_row_lanes(a), R = depthwise_ring_rows(a), blocks = (a.C + 63) / 64;
  int32_t* rings = reinterpret_cast<int32_t*>(scratch);  // [blocks][R][lanes]
  // input rows above and below the image: every byte the zero point, filled when first read
  int32_t* pad_row = rings + blocks * R * lanes;
  bool pad_row_filled = false;
  const Terms terms = make_terms(a, reinterpret_cast<uint8_t*>(pad_row + lanes));
  uint8_t* pad_pixel = reinterpret_cast<uint8_t*>(pad_row + lanes + 3 * depthwise_cp(a.C));
  std::memset(pad_pixel, static_cast<uint8_t>(a.x_zp), static_cast<size_t>(depthwise_cp(a.C)));
  int64_t* col_off = reinterpret_cast<int64_t*>(pad_pixel + depthwise_cp(a.C));
  if (a.C >= 64) column_offsets(a, col_off);
  int64_t* tags = col_off + depthwise_groups(a.KW) * a.OW * 4;  // [blocks][R]: the n * H + ih a slot holds, -1: none
  if (!a.keep_rings) std::fill(tags, tags + blocks * R, int64_t(-1));
  std::array<const int32_t*, 64> rows{};
  // Rows in chunks whose input stays in L2, and within a chunk one channel block at a time over
  // its rows, so that the block's ring of tap rows (KH rows of OW x 64 lanes) stays in L1 while the
  // rows read it, where all channels' would not. Each block keeps its ring across chunks.
  const int64_t chunk = std::max<int64_t>(1, kChunkInputBytes / std::max<int64_t>(1, a.sh * a.W * a.C));
  for (int64_t r0 = row_begin; r0 < row_end; r0 += chunk) {
    const int64_t r1 = std::min(row_end, r0 + chunk);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = 64 * b, nv = std::min<int64_t>(4, (a.C - c0 + 15) / 16);
      int32_t* ring = rings + b * R * lanes;
      int64_t* tag = tags + b * R;
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t n = row / a.OH, oh = row % a.OH;
        depthwise_input_rows(a, n, oh, ring, lanes, tag, pad_row, static_cast<uint8_t>(uint8_zero_point(a)),
                             pad_row_filled, [&](int64_t ih, int32_t* buf) {
                               build_tap_row(a, n, ih, c0, pad_pixel, col_off, buf);
                             }, rows.data());
        row_pixels(a, terms, rows.data(), row * a.OW - a.out_pixel0, c0, nv);
      }
    }
  }
}

}  // namespace qbackend::kernels
