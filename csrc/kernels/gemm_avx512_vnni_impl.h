// The AVX512-VNNI building blocks of the native int8 GEMM (contract and packed layout:
// gemm_kernels.h): register tiles of up to 6 rows x 64 columns that accumulate with vpdpbusd over
// the whole K, the fused epilogue, and the cache blocking. Included, after their
// `QB_TARGET` (cpu/targets.h), by gemm_avx512_vnni.cpp (the VNNI kernel) and gemm_amx.cpp (the AMX kernel,
// which runs its row and K remainders and its epilogue on these): everything is in an anonymous
// namespace, so each translation unit compiles its own copy for its own target.
//
// Tiles: MR rows x NV vectors of 16 columns. Rows of the activation are read in place (4 bytes
// broadcast per row and k-group: no packing of A, nothing allocated); where the sweep reads them from
// L3 or memory, each tile reads the next tile's rows ahead into L1 (software prefetch: ResNet-50's 1x1
// convs reducing 256-2048 channels took 0.93x their time at batch 32 with it, 0.85-1.00x per conv, Ice
// Lake: benchmarks/results/xeon_icelake/rows_read_ahead.md). The weight panel streams
// from L1/L2. Small MR hides the dot product's latency with KS independent accumulator sets over
// alternating k-groups (1 row: 4 sets of 4 vectors), summed before the epilogue.
#pragma once
// epilogue<..., Sum> takes __m512i or __m512 as a template argument: GCC notes that the vector
// types' alignment attributes do not take part in the template's identity, which is intended here.
#pragma GCC diagnostic ignored "-Wignored-attributes"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/avx512_common.h"
#include "kernels/gemm_common.h"
#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {
namespace {

constexpr int kMaxRows = 6;
// The accumulator type: int32 x 16 without __m512i's may_alias attribute, so that the compiler
// keeps the accumulator arrays in registers across the byte loads of the activation rows.
typedef int32_t Acc __attribute__((vector_size(64)));

// GELU with the rational erf of gemm_common.h: |error| <= 3.2e-7 * |y| in fp32 against the fp64
// erf gelu. 10 fma and one reciprocal: about half the work of the exp-based Abramowitz & Stegun
// 7.1.26 form it replaces (FFN1's GELU epilogue took a fifth of that GEMM).
inline __m512 gelu(__m512 y) {
  const __m512 yc = _mm512_max_ps(_mm512_min_ps(y, _mm512_set1_ps(kGeluClamp)), _mm512_set1_ps(-kGeluClamp));
  const __m512 t = _mm512_mul_ps(yc, yc);
  __m512 p = _mm512_set1_ps(kGeluP[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kGeluP[i]));
  __m512 q = _mm512_set1_ps(kGeluQ[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 5; ++i) q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(kGeluQ[i]));
  // 1 / q, q in [1, 176]: rcp14 (relative error < 2^-14) and one Newton step (< 2^-27).
  __m512 r = _mm512_rcp14_ps(q);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(q, r, _mm512_set1_ps(2.0f)));
  const __m512 erf = _mm512_mul_ps(_mm512_mul_ps(yc, p), r);
  const __m512 h = _mm512_mul_ps(y, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(h, erf, h);
}

// Stores one 16-column vector of fp32 results (the first `mask` lanes) as the output type
// (avx512::store: plain stores for full vectors, masked ones for the last, partial vector).
inline void store(const GemmArgs& g, __m512 y, int64_t m, int64_t n0, __mmask16 mask) {
  switch (g.out_type) {
    case GemmOut::f32:
      avx512::store(static_cast<float*>(g.out) + m * g.ldc + n0, mask, y);
      return;
    case GemmOut::bf16:
      avx512::store(static_cast<uint16_t*>(g.out) + m * g.ldc + n0, mask, avx512::round_bf16(y));
      return;
    case GemmOut::u8:
    case GemmOut::s8: {
      // Clamped in fp32 first: the conversion of a value beyond int32 would give INT_MIN.
      const __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(y, _mm512_set1_ps(g.out_inv_scale)),
                                                   _mm512_set1_ps(-1e6f)), _mm512_set1_ps(1e6f));
      const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(t), _mm512_set1_epi32(g.out_zp));
      uint8_t* dst = static_cast<uint8_t*>(g.out) + m * g.ldc + n0;
      const __m128i b = g.out_type == GemmOut::u8
                            ? _mm512_cvtusepi32_epi8(_mm512_max_epi32(q, _mm512_setzero_si512()))
                            : _mm512_cvtsepi32_epi8(q);
      avx512::store(dst, mask, b);
      return;
    }
  }
}

// The int32 sums of an MR x (NV * 16) tile over the whole K, written to out[r * NV + v]. Its
// accumulators never leave registers (kept apart from the epilogue so the compiler does not
// demote them to memory).
// B points at the tile's first 16-column vector; ldb is the byte step from one k-group to the next
// (64 x the panel's vectors).
// With PFL > 0, it also prefetches PFL cache lines of `pf` into L2 per k-group (the next panel's
// share of this tile: NextPanel in gemm_common.h). With `pa`, it prefetches into L1 one line of pa
// every other k-group: K * 8 bytes, the next row tile's rows where they follow this tile's
// (lda <= K * 4 / 3, contiguous_rows below). With `init`, the sums start from its NV vectors.
template <int MR, int NV, bool I8, int PFL = 0>
__attribute__((always_inline)) inline void dot_tile(const uint8_t* a, int64_t lda, const int8_t* B, int64_t ldb, int64_t K, __m512i* out,
                                                    const int8_t* pf = nullptr, const uint8_t* pa = nullptr,
                                                    const __m512i* init = nullptr) {
  constexpr int KS = MR == 1 ? 4 : (MR <= 3 ? 2 : 1);
  const int64_t kfull = K / 4, krem = K % 4;
  const int32_t flip = I8 ? static_cast<int32_t>(0x80808080u) : 0;

  Acc acc[KS][MR][NV];
#pragma GCC unroll 32
  for (int s = 0; s < KS; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[s][r][v] = s == 0 && init ? (Acc)init[v] : Acc{};

  // One k-group into accumulator set s: NV weight vectors, one broadcast per row.
#define QB_STEP(s, k4, WORD)                                                                       \
  {                                                                                              \
    const int8_t* bp = B + (k4) * ldb;                                                                 \
    __m512i bv[NV];                                                                              \
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(bp + v * 64); \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) {                                       \
      const __m512i av = _mm512_set1_epi32((WORD) ^ flip);                                       \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[s][r][v] =                        \
          (Acc)_mm512_dpbusd_epi32((__m512i)acc[s][r][v], av, bv[v]);                                       \
    }                                                                                            \
  }

#define QB_PREFETCH(k4)                                                                           \
  if constexpr (PFL > 0) {                                                                        \
    const char* q = reinterpret_cast<const char*>(pf + (k4) * (PFL * 64));                          \
    _mm_prefetch(q, _MM_HINT_T1);                                                                 \
    if constexpr (PFL > 1) _mm_prefetch(q + 64, _MM_HINT_T1);                                     \
  }

  int64_t k4 = 0;
  for (; k4 + KS <= kfull; k4 += KS) {
#pragma GCC unroll 4
    for (int s = 0; s < KS; ++s) {
      QB_STEP(s, k4 + s, load_a4(a + r * lda + (k4 + s) * 4))
      QB_PREFETCH(k4 + s)
      if (pa && ((k4 + s) & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(pa + (k4 + s) * 32), _MM_HINT_T0);
    }
  }
  for (; k4 < kfull; ++k4) {
    QB_STEP(0, k4, load_a4(a + r * lda + k4 * 4))
    QB_PREFETCH(k4)
  }
#undef QB_PREFETCH
  if (krem) {  // the last, partial k-group: its padding weights are 0, so the filler bytes do not count
    QB_STEP(0, kfull, load_tail(a + r * lda + kfull * 4, krem))
  }
#undef QB_STEP
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      Acc sum = acc[0][r][v];
#pragma GCC unroll 4
      for (int s = 1; s < KS; ++s) sum += acc[s][r][v];
      _mm512_storeu_si512(out + r * NV + v, (__m512i)sum);
    }
}

// float(r[m][n0 + i] - r_zp) for the first `mask` lanes of a 16-column vector of the residual
// (a plain load for a full vector: masked loads are slow on some CPUs, see store()).
inline __m512 residual(const GemmArgs& g, int64_t m, int64_t n0, __mmask16 mask) {
  const uint8_t* rp = g.r + m * g.ldr + n0;
  const __m128i rb = mask == static_cast<__mmask16>(0xffff) ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(rp))
                                                            : _mm_maskz_loadu_epi8(mask, rp);
  const __m512i ri = g.r_int8 ? _mm512_cvtepi8_epi32(rb) : _mm512_cvtepu8_epi32(rb);
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(ri, _mm512_set1_epi32(g.r_zp)));
}

// The sums as fp32: int32 GEMM sums less the zero-point correction; fp32 sums (the depthwise
// kernel's, zero-point free already) as they are.
inline __m512 sum_to_float(__m512i s, __m512i zp_colsum) { return _mm512_cvtepi32_ps(_mm512_sub_epi32(s, zp_colsum)); }
inline __m512 sum_to_float(__m512 s, __m512i) { return s; }

// The per-column terms of one 16-column vector of the output (columns n0..): its lane mask, the
// zero-point correction a_zp x colsum (int32 sums; 0 for fp32 sums), and scale = w_scale x x_scale
// and bias.
struct Column {
  __mmask16 mask;
  __m512i zp_colsum;
  __m512 scale, bias;

  Column(const GemmArgs& g, int64_t n0, int32_t a_zp, bool int_sums) {
    mask = avx512::tail_mask(std::min<int64_t>(16, g.N - n0));
    zp_colsum = int_sums ? _mm512_mullo_epi32(_mm512_loadu_si512(g.colsum + n0), _mm512_set1_epi32(a_zp))
                         : _mm512_setzero_si512();
    scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, g.w_scales + n0), _mm512_set1_ps(g.x_scale));
    bias = g.bias ? _mm512_maskz_loadu_ps(mask, g.bias + n0) : _mm512_setzero_ps();
  }
};

// Integer output without gelu: q = clamp(round(acc * s' + b' [+ (res - res_zp) * r'])) + out_zp
// with s' = scale / out_scale, b' = bias / out_scale and r' = res_scale / out_scale folded once
// per column, the clamp (and relu: q >= out_zp) in float before rounding. 9 vector ops per 16
// outputs instead of 13: the short-K GEMMs (1x1 convs from 16-128 channels) are bound by their
// epilogue. RequantColumn: a column's s', b' (and mask, correction); RequantOutput: the terms
// every column shares.
struct RequantColumn {
  __mmask16 mask;
  __m512i zp_colsum;
  __m512 s2, b2;

  RequantColumn() = default;
  RequantColumn(const GemmArgs& g, int64_t n0, int32_t a_zp, bool int_sums) {
    const Column c(g, n0, a_zp, int_sums);
    const __m512 inv = _mm512_set1_ps(g.out_inv_scale);
    mask = c.mask;
    zp_colsum = c.zp_colsum;
    s2 = _mm512_mul_ps(c.scale, inv);
    b2 = _mm512_mul_ps(c.bias, inv);
  }
};

struct RequantOutput {
  __m512 q_lo, q_hi, r2;  // bounds of round(y / out_scale) relative to out_zp (and relu's y >= 0)
  __m512i out_zp;
  bool u8;

  explicit RequantOutput(const GemmArgs& g) {
    u8 = g.out_type == GemmOut::u8;
    const float q_min = u8 ? 0.0f : -128.0f, q_max = u8 ? 255.0f : 127.0f;
    const float lo = q_min - static_cast<float>(g.out_zp);
    q_lo = _mm512_set1_ps(g.post == GemmPost::relu ? std::max(lo, 0.0f) : lo);
    q_hi = _mm512_set1_ps(q_max - static_cast<float>(g.out_zp));
    out_zp = _mm512_set1_epi32(g.out_zp);
    r2 = _mm512_set1_ps(g.r_scale * g.out_inv_scale);
  }
};

// y + (r - r_zp) * r', the residual's 16 bytes rb (int8 or uint8) widened.
__attribute__((always_inline)) inline __m512 add_residual(__m512 y, __m128i rb, bool r_int8, __m512i r_zp, __m512 r2) {
  const __m512i ri = r_int8 ? _mm512_cvtepi8_epi32(rb) : _mm512_cvtepu8_epi32(rb);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ri, r_zp)), r2, y);
}

// The output integers of y (in units of the output scale): clamped in float to [q_lo, q_hi] (the
// output type's range less out_zp, relu's lower bound included), rounded half to even, out_zp added.
__attribute__((always_inline)) inline __m512i requant_q(__m512 y, __m512 q_lo, __m512 q_hi, __m512i out_zp) {
  return _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(y, q_lo), q_hi)), out_zp);
}

// Rows m0 .. m0 + MR of column vector v (columns n0..) of a block of sums, requantized and stored.
// Every term is read into a local first: the stores go through byte pointers, which may alias g, c
// and o, so their fields would otherwise be loaded again after each row's store.
template <int MR, int NV, class Sum>
__attribute__((always_inline)) inline void requant_rows(const GemmArgs& g, const Sum* sums, int v, int64_t m0,
                                                        int64_t n0, const RequantColumn& c, const RequantOutput& o) {
  const __m512 s2 = c.s2, b2 = c.b2, q_lo = o.q_lo, q_hi = o.q_hi, r2 = o.r2;
  const __m512i zp_colsum = c.zp_colsum, out_zp = o.out_zp, r_zp = _mm512_set1_epi32(g.r_zp);
  const __mmask16 mask = c.mask;
  const bool u8 = o.u8, r_int8 = g.r_int8, full = mask == static_cast<__mmask16>(0xffff);
  const int64_t ldc = g.ldc, ldr = g.ldr;
  uint8_t* const out = static_cast<uint8_t*>(g.out) + m0 * ldc + n0;
  const uint8_t* const res = g.r ? g.r + m0 * ldr + n0 : nullptr;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m512 t = _mm512_fmadd_ps(sum_to_float(sums[r * NV + v], zp_colsum), s2, b2);
    if (res) {
      const uint8_t* rp = res + r * ldr;
      const __m128i rb = full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(rp)) : _mm_maskz_loadu_epi8(mask, rp);
      t = add_residual(t, rb, r_int8, r_zp, r2);
    }
    const __m512i q = requant_q(t, q_lo, q_hi, out_zp);
    avx512::store(out + r * ldc, mask, u8 ? _mm512_cvtusepi32_epi8(q) : _mm512_cvtsepi32_epi8(q));
  }
}

// The epilogue of an MR x (NV * 16) block of sums (sums[r * NV + v]: int32 __m512i, or exact
// integer values in fp32 __m512) of rows m0.. and columns n_base..: per 16-column vector, the
// per-column terms are loaded once for the MR rows. a_zp is the zero point int32 sums are taken
// against (the uint8 view's, or 128 less for sums of signed activations); fp32 sums have none.
template <int MR, int NV, class Sum = __m512i>
__attribute__((always_inline)) inline void epilogue(const GemmArgs& g, const Sum* sums, int64_t m0, int64_t n_base, int32_t a_zp) {
  constexpr bool int_sums = std::is_same_v<Sum, __m512i>;
  if (requantizes_without_gelu(g)) {
    const RequantOutput o(g);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int64_t n0 = n_base + v * 16;
      requant_rows<MR, NV>(g, sums, v, m0, n0, RequantColumn(g, n0, a_zp, int_sums), o);
    }
    return;
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t n0 = n_base + v * 16;
    const Column c(g, n0, a_zp, int_sums);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t m = m0 + r;
      __m512 y = _mm512_fmadd_ps(sum_to_float(sums[r * NV + v], c.zp_colsum), c.scale, c.bias);
      if (g.r) y = _mm512_fmadd_ps(residual(g, m, n0, c.mask), _mm512_set1_ps(g.r_scale), y);
      if (g.post == GemmPost::relu) y = _mm512_max_ps(y, _mm512_setzero_ps());
      else if (g.post == GemmPost::gelu) y = gelu(y);
      store(g, y, m, n0, c.mask);
    }
  }
}

// Whether the rows of a row tile follow each other closely enough (lda <= K * 4 / 3) for dot_tile's
// read ahead of the next tile's rows (K * 8 bytes from the next tile's first row).
inline bool contiguous_rows(const GemmArgs& g) { return g.lda * 3 <= g.K * 4; }

// The next row tile's rows for dot_tile's read ahead where the sweep reads rows [.., me) from L3 or
// memory (rows_cold) and they follow each other; nullptr otherwise.
inline const uint8_t* rows_ahead(const GemmArgs& g, const uint8_t* a, bool rows_cold) {
  return rows_cold && contiguous_rows(g) ? a + kMaxRows * g.lda : nullptr;
}

// One MR x (NV * 16) tile of rows m0.. and panel p (NV: the panel's vectors), prefetching
// pf_lines (0, 1 or 2) lines of pf per k-group, and the next tile's rows where rows_cold.
template <int MR, int NV, bool I8>
void tile(const GemmArgs& g, int64_t m0, int64_t p, const int8_t* pf, int pf_lines, bool rows_cold) {
  __m512i sums[MR * NV];
  const int8_t* B = g.b + p * kGemmPanel * gemm_kp(g.K);
  const uint8_t* a = g.a + m0 * g.lda;
  const uint8_t* pa = rows_ahead(g, a, rows_cold);
  if (pf_lines == 1) dot_tile<MR, NV, I8, 1>(a, g.lda, B, NV * 64, g.K, sums, pf, pa);
  else if (pf_lines == 2) dot_tile<MR, NV, I8, 2>(a, g.lda, B, NV * 64, g.K, sums, pf, pa);
  else dot_tile<MR, NV, I8>(a, g.lda, B, NV * 64, g.K, sums, nullptr, pa);
  epilogue<MR, NV>(g, sums, m0, p * kGemmPanel, g.a_zp);
}

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t, const int8_t*, int, bool);

template <bool I8, int NV, int... R>
constexpr auto row_table(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&tile<R + 1, NV, I8>...};
}

template <bool I8>
struct Tiles {
  // [NV - 1][MR - 1]
  static constexpr std::array<std::array<TileFn, kMaxRows>, 4> table = {
      row_table<I8, 1>(std::make_integer_sequence<int, kMaxRows>{}),
      row_table<I8, 2>(std::make_integer_sequence<int, kMaxRows>{}),
      row_table<I8, 3>(std::make_integer_sequence<int, kMaxRows>{}),
      row_table<I8, 4>(std::make_integer_sequence<int, kMaxRows>{})};
};

// The requantizing epilogue's terms of one panel (integer output without gelu), worked out once
// for all of its row tiles. The per-tile epilogue works them out for every 6 rows, which on
// short-K GEMMs (1x1 convs over 16-64 channels) costs 10-19% of their time (one thread, AMD Zen 5).
// `start`: each vector's - a_zp x colsum, from which the row tiles' sums start, so that they arrive
// corrected and the epilogue subtracts nothing (int32 sums wrap alike in either order: the same
// sums). One vector op fewer per 16 outputs: MobileNetV2's fused blocks, whose expansions read 16-160
// channels, took 0.97x their time (Ice Lake, paired plan replays: benchmarks/results/xeon_icelake/
// gemm_start_sums_ab.md).
template <int NV>
struct RequantTerms {
  RequantOutput out;
  RequantColumn col[NV];
  __m512i start[NV];

  RequantTerms(const GemmArgs& g, int64_t n_base) : out(g) {
    for (int v = 0; v < NV; ++v) {
      col[v] = RequantColumn(g, n_base + v * 16, g.a_zp, true);
      start[v] = _mm512_sub_epi32(_mm512_setzero_si512(), col[v].zp_colsum);
    }
  }
};

// Rows [mb, me) of panel p in full 6-row tiles with the requantizing epilogue, the column terms
// worked out once; returns the first row not done (the caller runs the last, partial tile).
template <int NV, bool I8>
int64_t requant_full_tiles(const GemmArgs& g, int64_t p, int64_t mb, int64_t me, const int8_t* pf_base,
                           int64_t slice, int64_t pf_bytes, int lines, bool rows_cold) {
  const RequantTerms<NV> terms(g, p * kGemmPanel);
  const int8_t* B = g.b + p * kGemmPanel * gemm_kp(g.K);
  int64_t m = mb, i = 0;
  for (; m + kMaxRows <= me; m += kMaxRows, ++i) {
    __m512i sums[kMaxRows * NV];
    const uint8_t* a = g.a + m * g.lda;
    const int8_t* pf = lines && i * slice < pf_bytes ? pf_base + i * slice : nullptr;
    const uint8_t* pa = rows_ahead(g, a, rows_cold);
    if (pf && lines == 1) dot_tile<kMaxRows, NV, I8, 1>(a, g.lda, B, NV * 64, g.K, sums, pf, pa, terms.start);
    else if (pf && lines == 2) dot_tile<kMaxRows, NV, I8, 2>(a, g.lda, B, NV * 64, g.K, sums, pf, pa, terms.start);
    else dot_tile<kMaxRows, NV, I8>(a, g.lda, B, NV * 64, g.K, sums, nullptr, pa, terms.start);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      RequantColumn c = terms.col[v];
      c.zp_colsum = _mm512_setzero_si512();  // the sums started from terms.start: nothing to subtract
      requant_rows<kMaxRows, NV>(g, sums, v, m, p * kGemmPanel + v * 16, c, terms.out);
    }
  }
  return m;
}

template <bool I8>
int64_t requant_full_tiles(const GemmArgs& g, int64_t p, int64_t nv, int64_t mb, int64_t me, const int8_t* pf_base,
                           int64_t slice, int64_t pf_bytes, int lines, bool rows_cold) {
  switch (nv) {
    case 1: return requant_full_tiles<1, I8>(g, p, mb, me, pf_base, slice, pf_bytes, lines, rows_cold);
    case 2: return requant_full_tiles<2, I8>(g, p, mb, me, pf_base, slice, pf_bytes, lines, rows_cold);
    case 3: return requant_full_tiles<3, I8>(g, p, mb, me, pf_base, slice, pf_bytes, lines, rows_cold);
    default: return requant_full_tiles<4, I8>(g, p, mb, me, pf_base, slice, pf_bytes, lines, rows_cold);
  }
}

// Rows [mb, me) of panel p on the VNNI register tiles. With `next` and at least two row tiles,
// the tiles share the prefetch of the next panel: tile i takes its i-th slice of
// min(2, ceil(vectors / tiles)) lines per k-group (with three tiles, two of them cover it all).
// With one tile (M <= 6: a GEMV streaming the weight) the prefetch measured slower (the hardware
// prefetcher keeps up with a single stream), so it has none (benchmarks/results/
// design_measurements.md, "Native GEMM panel prefetch"). With rows_cold (the sweep's first pass over
// these rows, which come from L3 or memory), each row tile reads the next one's rows ahead into L1.
inline void vnni_panel_rows(const GemmArgs& g, int64_t p, int64_t mb, int64_t me, NextPanel next = {},
                            bool rows_cold = false) {
  rows_cold = rows_cold && rows_read_ahead();
  const auto& table = g.a_int8 ? Tiles<true>::table : Tiles<false>::table;
  const int64_t cols = std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel);
  const auto& by_rows = table[(cols + 15) / 16 - 1];
  const int64_t tiles = (me - mb + kMaxRows - 1) / kMaxRows, kgroups = gemm_kp(g.K) / 4;
  const int64_t next_vectors = next.bytes / (kgroups * 64);
  const int lines = next.p && tiles >= 2 ? static_cast<int>(std::min<int64_t>(2, (next_vectors + tiles - 1) / tiles)) : 0;
  const int64_t slice = lines * kgroups * 64;
  int64_t i = 0, m = mb;
  if (requantizes_without_gelu(g)) {
    const int64_t nv = (cols + 15) / 16;
    m = g.a_int8 ? requant_full_tiles<true>(g, p, nv, mb, me, next.p, slice, next.bytes, lines, rows_cold)
                 : requant_full_tiles<false>(g, p, nv, mb, me, next.p, slice, next.bytes, lines, rows_cold);
    i = (m - mb) / kMaxRows;
  }
  for (; m < me; m += kMaxRows, ++i) {
    const int8_t* pf = lines && i * slice < next.bytes ? next.p + i * slice : nullptr;
    by_rows[std::min<int64_t>(kMaxRows, me - m) - 1](g, m, p, pf, lines, rows_cold);
  }
}

}  // namespace
}  // namespace qbackend::kernels
