// The AVX512 attention kernel's body, templated over how its two matrix products multiply,
// included by two translation units after their QB_TARGET: attention_avx512.cpp (fp32 products)
// and attention_avx512_bf16.cpp (built for avx512bf16 too; it adds the bf16 products policy and
// the rows loop over bf16 operands with fp32 accumulation).
//
// Per call (one (batch, head), a range of query rows): k is transposed once into a key-major
// panel, v brought into the layout the P v loop reads; then per block of R = 8 query rows: the
// rows times scale; scores s [R][Skp] by a register-tiled loop (8 rows x 32 keys of fp32
// accumulators); each row masked, exponentiated against its maximum and summed (fp32); out =
// (P v) / sum by a second tiled loop (4 rows x 64 output columns), converted and stored straight
// into the output row.
//
// fp32 path: kt [D][Skp] fp32 (zero columns past Sk); fp32 v read in place, bf16 v widened.
// bf16 path: q, k, P and v rounded to bf16 (nearest even) and multiplied in pairs along the
//   reduced dimension: kt [Dp/2][Skp] of (k[j][d], k[j][d+1]) pairs, vt [Skp2/2][Dvp] of
//   (v[j][e], v[j+1][e]) pairs (Dp, Skp2: D, Sk rounded up to even; zero padding).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention_kernels.h"
#include "kernels/avx512_common.h"

namespace qbackend::kernels {
namespace {  // internal linkage: the two translation units compile it for different targets
namespace attention_detail {

using avx512::round_bf16;
using avx512::store;
using avx512::tail_mask;
using avx512::W;
using avx512::widen_bf16;

constexpr int64_t R = 8;  // query rows per block

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

inline float widen_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// n values of a row (fp32 or bf16) times mul, into dst (fp32).
inline void widen_row(const void* src, AttnIn in, int64_t n, float mul, float* dst) {
  const __m512 s = _mm512_set1_ps(mul);
  for (int64_t i = 0; i < n; i += W) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = in == AttnIn::f32 ? _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i)
                                       : widen_bf16(static_cast<const uint16_t*>(src) + i, m);
    store(dst + i, m, _mm512_mul_ps(x, s));
  }
}

// How the two matrix products multiply. A packed operand is an array of Words; the reduced
// dimension advances one Word at a time.
//   F32Products:  Word = float; fp32 FMAs.
//   BF16Products: Word = uint32_t, a pair of bf16 values along the reduced dimension; vdpbf16ps
//                 (defined in attention_avx512_bf16.cpp, the one unit built for avx512bf16).
struct F32Products {
  using Word = float;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static __m512 broadcast(float x) { return _mm512_set1_ps(x); }
  static __m512 madd(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
};

// s[r][j0 .. j0 + 16 NJ) = sum_d q[r][d] kt[d][j] for the R rows (q: R rows of Dk Words; kt: Dk
// rows of Skp Words).
template <class P, int NJ>
inline void qk_tile(const typename P::Word* q, int64_t Dk, const typename P::Word* kt, int64_t Skp, int64_t j0,
                    float* s) {
  using Vec = decltype(P::load(kt));
  __m512 acc[R][NJ];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NJ; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < Dk; ++d) {
    const typename P::Word* kr = kt + d * Skp + j0;
    Vec kv[NJ];
    for (int c = 0; c < NJ; ++c) kv[c] = P::load(kr + c * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec qv = P::broadcast(q[r * Dk + d]);
      for (int c = 0; c < NJ; ++c) acc[r][c] = P::madd(acc[r][c], qv, kv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NJ; ++c) _mm512_storeu_ps(s + r * Skp + j0 + c * W, acc[r][c]);
}

// The R x Skp scores of a block of query rows, 32 keys at a time (16 for the last).
template <class P>
inline void qk_block(const typename P::Word* q, int64_t Dk, const typename P::Word* kt, int64_t Skp, float* s) {
  int64_t j0 = 0;
  for (; j0 + 2 * W <= Skp; j0 += 2 * W) qk_tile<P, 2>(q, Dk, kt, Skp, j0, s);
  if (j0 < Skp) qk_tile<P, 1>(q, Dk, kt, Skp, j0, s);
}

// Masks row i's scores, replaces them by exp(score - max) (0 past the causal limit) and returns
// 1 / sum (0 when every key is masked).
inline float softmax_row(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, float* row) {
  const int64_t n = p.causal ? std::min(p.Sk, i + 1) : p.Sk;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const char* mrow = nullptr;
  if (p.mask_kind != AttnMask::none) {
    const int64_t off = b * p.m_sb + h * p.m_sh + i * p.m_si;
    const int64_t size = p.mask_kind == AttnMask::boolean ? 1 : p.mask_kind == AttnMask::f32 ? 4 : 2;
    mrow = static_cast<const char*>(p.mask) + off * size;
  }
  __m512 vmax = ninf;
  for (int64_t j = 0; j < n; j += W) {
    const __mmask16 m = tail_mask(n - j);
    __m512 x = _mm512_maskz_loadu_ps(m, row + j);
    switch (p.mask_kind) {
      case AttnMask::none: break;
      case AttnMask::boolean: {
        const __m128i bytes = _mm_maskz_loadu_epi8(m, mrow + j);
        const __mmask16 keep = _mm_mask_cmpneq_epi8_mask(m, bytes, _mm_setzero_si128());
        x = _mm512_mask_blend_ps(keep, ninf, x);
        break;
      }
      case AttnMask::f32: x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(mrow) + j)); break;
      case AttnMask::bf16: x = _mm512_add_ps(x, widen_bf16(reinterpret_cast<const uint16_t*>(mrow) + j, m)); break;
    }
    store(row + j, m, x);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  if (n == 0 || mx == -std::numeric_limits<float>::infinity()) {
    std::fill(row, row + p.Sk, 0.0f);
    return 0.0f;
  }
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += W) {
    const __mmask16 m = tail_mask(n - j);
    const __m512 e = avx512::exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vm));
    store(row + j, m, e);
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
  }
  std::fill(row + n, row + p.Sk, 0.0f);
  return 1.0f / _mm512_reduce_add_ps(vsum);
}

// Stores y (16 lanes under mask m) at element e of output row `dst` in the problem's output type.
inline void store_out(const AttentionProblem& p, void* dst, int64_t e, __m512 y, __mmask16 m) {
  switch (p.out_kind) {
    case AttnOut::f32: store(static_cast<float*>(dst) + e, m, y); return;
    case AttnOut::bf16: store(static_cast<uint16_t*>(dst) + e, m, round_bf16(y)); return;
    case AttnOut::u8:
    case AttnOut::s8: {
      const bool u8 = p.out_kind == AttnOut::u8;
      const float lo = float((u8 ? 0 : -128) - p.out_zp), hi = float((u8 ? 255 : 127) - p.out_zp);
      const __m512i q = avx512::quantize(y, _mm512_set1_ps(p.out_scale), _mm512_set1_ps(lo), _mm512_set1_ps(hi),
                                         _mm512_set1_epi32(p.out_zp));
      store(static_cast<char*>(dst) + e, m, _mm512_cvtepi32_epi8(q));
      return;
    }
  }
}

// Output rows r0 .. r0 + 4 (those < rows) of a block, columns [e0, e0 + 16 NZ) (the last chunk
// masked by `last`): sum_j P[r][j] v[j][e] times inv[r], stored in the output type. P: rows of
// p_stride Words, nj of them used; v: nj rows of v_stride Words.
template <class P, int NZ>
inline void pv_tile(const AttentionProblem& p, const typename P::Word* pr, int64_t p_stride, int64_t nj,
                    const typename P::Word* v, int64_t v_stride, int64_t e0, __mmask16 last, const float* inv,
                    void* const* out_rows, int rows) {
  using Vec = decltype(P::load(v));
  constexpr int RR = 4;
  __m512 acc[RR][NZ];
#pragma GCC unroll 4
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NZ; ++c) acc[r][c] = _mm512_setzero_ps();
  const bool full = last == __mmask16(0xFFFF);  // masked loads in this loop cost ~40% on Zen 5
  for (int64_t j = 0; j < nj; ++j) {
    const typename P::Word* vr = v + j * v_stride + e0;
    Vec vv[NZ];
#pragma GCC unroll 4
    for (int c = 0; c < NZ; ++c) vv[c] = c + 1 < NZ || full ? P::load(vr + c * W) : P::load(vr + c * W, last);
#pragma GCC unroll 4
    for (int r = 0; r < RR; ++r) {
      const Vec pj = P::broadcast(pr[r * p_stride + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NZ; ++c) acc[r][c] = P::madd(acc[r][c], pj, vv[c]);
    }
  }
  for (int r = 0; r < std::min(rows, RR); ++r) {
    const __m512 sc = _mm512_set1_ps(inv[r]);
    for (int c = 0; c < NZ; ++c)
      store_out(p, out_rows[r], e0 + c * W, _mm512_mul_ps(acc[r][c], sc), c + 1 < NZ ? __mmask16(0xFFFF) : last);
  }
}

inline int64_t out_elem_size(AttnOut o) { return o == AttnOut::f32 ? 4 : o == AttnOut::bf16 ? 2 : 1; }

// out = (P v) / sum for the `rows` query rows from ib of head (b, h) (obase: that head's output),
// 4 rows x 64 columns at a time.
template <class P>
inline void pv_block(const AttentionProblem& p, char* obase, int64_t ib, int rows, const typename P::Word* pp,
                     int64_t p_stride, int64_t nj, const typename P::Word* v, int64_t v_stride, const float* inv) {
  const int64_t osz = out_elem_size(p.out_kind);
  for (int r0 = 0; r0 < rows; r0 += 4) {
    void* out_rows[4];
    for (int r = 0; r < 4; ++r) out_rows[r] = obase + (ib + r0 + std::min(r, rows - r0 - 1)) * p.o_si * osz;
    const typename P::Word* pr = pp + r0 * p_stride;
    const int n = rows - r0;
    for (int64_t e0 = 0; e0 < p.Dv; e0 += 4 * W) {
      const int64_t left = p.Dv - e0;
      const int nz = int(std::min<int64_t>(4, (left + W - 1) / W));
      const __mmask16 last = tail_mask(left - (nz - 1) * W);
      switch (nz) {
        case 4: pv_tile<P, 4>(p, pr, p_stride, nj, v, v_stride, e0, last, inv + r0, out_rows, n); break;
        case 3: pv_tile<P, 3>(p, pr, p_stride, nj, v, v_stride, e0, last, inv + r0, out_rows, n); break;
        case 2: pv_tile<P, 2>(p, pr, p_stride, nj, v, v_stride, e0, last, inv + r0, out_rows, n); break;
        default: pv_tile<P, 1>(p, pr, p_stride, nj, v, v_stride, e0, last, inv + r0, out_rows, n); break;
      }
    }
  }
}

inline int64_t in_elem_size(AttnIn t) { return t == AttnIn::f32 ? 4 : 2; }

inline size_t scratch_words_f32(const AttentionProblem& p) {
  const int64_t Skp = round_up(std::max<int64_t>(p.Sk, 1), W);
  const int64_t vp = p.in == AttnIn::bf16 ? p.Sk * p.Dv : 0;
  return size_t(p.D * Skp + vp + R * p.D + R * Skp + R);
}

inline void rows_f32(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1, float* scratch) {
  const int64_t Skp = round_up(std::max<int64_t>(p.Sk, 1), W);
  const int64_t esz = in_elem_size(p.in);
  float* kt = scratch;
  float* vp = kt + p.D * Skp;
  float* qb = vp + (p.in == AttnIn::bf16 ? p.Sk * p.Dv : 0);
  float* s = qb + R * p.D;
  float* inv = s + R * Skp;

  // k -> kt [D][Skp] (fp32, zero columns past Sk)
  const char* kbase = static_cast<const char*>(p.k) + (b * p.k_sb + h * p.k_sh) * esz;
  for (int64_t j = 0; j < p.Sk; ++j) {
    const char* kr = kbase + j * p.k_si * esz;
    if (p.in == AttnIn::f32) {
      const float* f = reinterpret_cast<const float*>(kr);
      for (int64_t d = 0; d < p.D; ++d) kt[d * Skp + j] = f[d];
    } else {
      const uint16_t* f = reinterpret_cast<const uint16_t*>(kr);
      for (int64_t d = 0; d < p.D; ++d) kt[d * Skp + j] = widen_bf16(f[d]);
    }
  }
  for (int64_t d = 0; d < p.D; ++d) std::fill(kt + d * Skp + p.Sk, kt + (d + 1) * Skp, 0.0f);

  // v: fp32 in place, bf16 widened into vp [Sk][Dv]
  const char* vbase = static_cast<const char*>(p.v) + (b * p.v_sb + h * p.v_sh) * esz;
  const float* v = reinterpret_cast<const float*>(vbase);
  int64_t v_si = p.v_si;
  if (p.in == AttnIn::bf16) {
    for (int64_t j = 0; j < p.Sk; ++j) widen_row(vbase + j * p.v_si * esz, p.in, p.Dv, 1.0f, vp + j * p.Dv);
    v = vp;
    v_si = p.Dv;
  }

  const char* qbase = static_cast<const char*>(p.q) + (b * p.q_sb + h * p.q_sh) * esz;
  char* obase = static_cast<char*>(p.out) + (b * p.o_sb + h * p.o_sh) * out_elem_size(p.out_kind);
  for (int64_t ib = i0; ib < i1; ib += R) {
    const int rows = int(std::min<int64_t>(R, i1 - ib));
    for (int r = 0; r < R; ++r) {
      if (r < rows) widen_row(qbase + (ib + r) * p.q_si * esz, p.in, p.D, p.scale, qb + r * p.D);
      else std::fill(qb + r * p.D, qb + (r + 1) * p.D, 0.0f);
    }
    qk_block<F32Products>(qb, p.D, kt, Skp, s);
    for (int r = 0; r < R; ++r) inv[r] = r < rows ? softmax_row(p, b, h, ib + r, s + r * Skp) : 0.0f;
    pv_block<F32Products>(p, obase, ib, rows, s, Skp, p.Sk, v, v_si, inv);
  }
}

// Scratch (in 4-byte words): kt Dh*Skp, vt Sh*Dvp, q R*Dh, s R*Skp (fp32), P R*Sh, inv R, and
// a staging row of max(Dh, Dvp).
inline size_t scratch_words_bf16(const AttentionProblem& p) {
  const int64_t Skp = round_up(std::max<int64_t>(p.Sk, 1), W), Dh = (p.D + 1) / 2, Sh = (p.Sk + 1) / 2;
  const int64_t Dvp = round_up(p.Dv, W);
  return size_t(Dh * Skp + Sh * Dvp + R * Dh + R * Skp + R * Sh + R + std::max(Dh, Dvp));
}


}  // namespace attention_detail
}  // namespace
}  // namespace qbackend::kernels
