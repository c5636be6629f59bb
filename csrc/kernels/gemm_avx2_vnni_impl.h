// The native int8 GEMM's 256-bit kernel (contract and packed layout: gemm_kernels.h), for AVX2 CPUs
// with AVX-VNNI (the VEX-encoded vpdpbusd: Intel's Alder Lake and later client cores, Sierra
// Forest / Xeon 6 E-core servers, AMD Zen 5), and for AVX2 CPUs without it on weights of 7 bits.
// Included, after their `QB_TARGET` (cpu/targets.h), by gemm_avx2_vnni.cpp, gemm_avx2_vnni_evex.cpp
// and gemm_avx2_pairs.cpp, which instantiate `gemm<Dot>` with a policy: `Dot::dpbusd(acc, a, b)`
// encodes the dot product (the VEX instruction, its EVEX form so that CPUs with AVX512-VNNI but no
// AVX-VNNI, AMD Zen 4, can test the same code, or AVX2's pair products), `Dot::kMaxRows` is the
// tallest register tile the policy's registers allow, `Dot::kChained` says whether the
// accumulator is an input of the dot product's latency (then small tiles take several accumulator
// sets), and `Dot::kFullTileLoop` whether the policy has its own K loop for full tiles of uint8 rows
// (`Dot::full_tile(a, lda, B, ldb, k_groups, out, pf, pf_step)`).
//
// The same packed panels as the AVX512 kernels: a panel's 16-column vector (64 bytes per
// k-group) is read as two 8-column halves. Register tiles are up to Dot::kMaxRows rows x one
// 16-column vector (VNNI: 6 rows, 12 accumulators, 2 weight registers and a broadcast: 15 of the 16
// ymm registers); rows are read in place, 4 bytes broadcast per row and k-group; with a chained dot
// product, small tiles take 2-4 independent accumulator sets over alternating k-groups to hide its
// latency. The epilogue is the AVX512
// kernel's on 8 lanes: folded requantization for integer outputs, otherwise scale, bias, residual,
// relu or gelu (the same rational erf, with an exact division) and the output conversion. Partial
// vectors (the last columns of N) use masked loads for the per-column terms and byte copies or
// masked stores for the outputs; nothing is read or written past a row.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/probe.h"
#include "kernels/avx2_common.h"
#include "kernels/gemm_common.h"
#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {
namespace {

// int32 x 8 without __m256i's may_alias attribute (keeps the accumulators in registers; see the
// AVX512 kernel).
typedef int32_t Acc __attribute__((vector_size(32)));

// The int32 sums of MR rows x 16 columns (out[r * 2 + h], h = 8-column half) over the whole K. B
// points at the vector's first k-group; ldb is the byte step to the next (64 x the panel's vectors).
// With pf, k-group k also prefetches the cache line at pf + k * pf_step into L2 (weights the sweep
// reads next: see gemm below).
template <class Dot, int MR, bool I8>
__attribute__((always_inline)) inline void dot_tile(const uint8_t* a, int64_t lda, const int8_t* B, int64_t ldb,
                                                    int64_t K, __m256i* out, const int8_t* pf, int64_t pf_step) {
  constexpr int KS = !Dot::kChained ? 1 : (MR == 1 ? 4 : (MR <= 3 ? 2 : 1));
  const int64_t kfull = K / 4, krem = K % 4;
  const int32_t flip = I8 ? static_cast<int32_t>(0x80808080u) : 0;
  if constexpr (Dot::kFullTileLoop && MR == Dot::kMaxRows && !I8) {
    // The policy's own loop over the full k-groups of a full tile (the compiler keeps copies of
    // this many accumulators on the stack), then the partial k-group here.
    Dot::full_tile(a, lda, B, ldb, kfull, out, pf, pf_step);
    if (krem) {
      const int8_t* bp = B + kfull * ldb;
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 32));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i av = _mm256_set1_epi32(load_tail(a + r * lda + kfull * 4, krem));
        out[r * 2] = Dot::dpbusd(out[r * 2], av, b0);
        out[r * 2 + 1] = Dot::dpbusd(out[r * 2 + 1], av, b1);
      }
    }
    return;
  }
  Acc acc[KS][MR][2];
#pragma GCC unroll 32
  for (int s = 0; s < KS; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[s][r][0] = acc[s][r][1] = Acc{};

#define QB_STEP(s, k4, WORD)                                                                           \
  {                                                                                                  \
    const int8_t* bp = B + (k4) * ldb;                                                               \
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp));                     \
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 32));                \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) {                                           \
      const __m256i av = _mm256_set1_epi32((WORD) ^ flip);                                           \
      acc[s][r][0] = (Acc)Dot::dpbusd((__m256i)acc[s][r][0], av, b0);                                \
      acc[s][r][1] = (Acc)Dot::dpbusd((__m256i)acc[s][r][1], av, b1);                                \
    }                                                                                                \
  }

  int64_t k4 = 0;
  if (pf) {
    for (; k4 < kfull; ++k4) {
      QB_STEP(0, k4, load_a4(a + r * lda + k4 * 4))
      _mm_prefetch(reinterpret_cast<const char*>(pf + k4 * pf_step), _MM_HINT_T1);
    }
  }
  for (; k4 + KS <= kfull; k4 += KS) {
#pragma GCC unroll 4
    for (int s = 0; s < KS; ++s) QB_STEP(s, k4 + s, load_a4(a + r * lda + (k4 + s) * 4))
  }
  for (; k4 < kfull; ++k4) QB_STEP(0, k4, load_a4(a + r * lda + k4 * 4))
  if (krem) {  // the last, partial k-group: its padding weights are 0
    QB_STEP(0, kfull, load_tail(a + r * lda + kfull * 4, krem))
  }
#undef QB_STEP
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      Acc sum = acc[0][r][h];
#pragma GCC unroll 4
      for (int s = 1; s < KS; ++s) sum += acc[s][r][h];
      out[r * 2 + h] = (__m256i)sum;
    }
}

inline __m256 load_f32(const float* p, int64_t valid, __m256i mask) {
  return valid == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

// float(r[m][n0 + i] - r_zp), i < valid.
inline __m256 residual(const GemmArgs& g, int64_t m, int64_t n0, int64_t valid) {
  const uint8_t* rp = g.r + m * g.ldr + n0;
  int64_t bytes = 0;
  std::memcpy(&bytes, rp, static_cast<size_t>(valid));
  const __m128i rb = _mm_cvtsi64_si128(bytes);
  const __m256i ri = g.r_int8 ? _mm256_cvtepi8_epi32(rb) : _mm256_cvtepu8_epi32(rb);
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(ri, _mm256_set1_epi32(g.r_zp)));
}

inline __m256 gelu(__m256 y) {
  const __m256 yc = _mm256_max_ps(_mm256_min_ps(y, _mm256_set1_ps(kGeluClamp)), _mm256_set1_ps(-kGeluClamp));
  const __m256 t = _mm256_mul_ps(yc, yc);
  __m256 p = _mm256_set1_ps(kGeluP[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kGeluP[i]));
  __m256 q = _mm256_set1_ps(kGeluQ[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 5; ++i) q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(kGeluQ[i]));
  // AVX2's reciprocal estimate has 12 bits (one Newton step would leave ~2^-23): an exact division.
  const __m256 erf = _mm256_div_ps(_mm256_mul_ps(yc, p), q);
  const __m256 h = _mm256_mul_ps(y, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(h, erf, h);
}

// Stores the low byte of each int32 lane (values already in the output range), valid lanes.
inline void store_bytes(uint8_t* dst, __m256i q, int64_t valid) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  const int64_t bytes = _mm_cvtsi128_si64(_mm256_castsi256_si128(b));
  if (valid == 8) std::memcpy(dst, &bytes, 8);
  else std::memcpy(dst, &bytes, static_cast<size_t>(valid));
}

// fp32 -> bf16 bits, round to nearest even, NaN kept a quiet NaN (as the AVX512 kernels).
inline void store_bf16(uint16_t* dst, __m256 v, int64_t valid) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_srli_epi32(
      _mm256_blendv_epi8(rounded, _mm256_or_si256(b, _mm256_set1_epi32(0x00400000)), nan), 16);
  const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  if (valid == 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
  else {
    alignas(16) uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
    std::memcpy(dst, tmp, static_cast<size_t>(valid) * 2);
  }
}

// The folded epilogue (requantizes_without_gelu) of whole 16-column vectors: the call's constants
// and one vector's per-column terms, which callers with many tiles of a vector work out once
// (gemm's row tiles per panel, the Winograd route per vector).
struct FoldedConsts {
  __m256 q_lo, q_hi;  // bounds of round(y / out_scale) relative to out_zp (relu: >= 0)
  __m256 r2;          // r_scale / out_scale
  __m256i zp16;       // out_zp in int16 lanes
  bool u8;
};

struct FoldedTerms {
  __m256i zc[2];      // colsum * a_zp, per 8-column half
  __m256 s2[2], b2[2];  // w_scale * x_scale / out_scale, bias / out_scale
};

inline FoldedConsts folded_consts(const GemmArgs& g) {
  FoldedConsts c;
  c.u8 = g.out_type == GemmOut::u8;
  const float q_min = c.u8 ? 0.0f : -128.0f, q_max = c.u8 ? 255.0f : 127.0f;
  const float lo = q_min - static_cast<float>(g.out_zp);
  c.q_lo = _mm256_set1_ps(g.post == GemmPost::relu ? std::max(lo, 0.0f) : lo);
  c.q_hi = _mm256_set1_ps(q_max - static_cast<float>(g.out_zp));
  c.r2 = _mm256_set1_ps(g.r_scale * g.out_inv_scale);
  c.zp16 = _mm256_set1_epi16(static_cast<int16_t>(g.out_zp));
  return c;
}

// The terms of the full vector at columns n16.. (n16 + 16 <= N).
inline FoldedTerms folded_terms(const GemmArgs& g, int64_t n16) {
  FoldedTerms t;
  const __m256 inv = _mm256_set1_ps(g.out_inv_scale), xs = _mm256_set1_ps(g.x_scale);
  const __m256i a_zp = _mm256_set1_epi32(g.a_zp);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const int64_t n0 = n16 + h * 8;
    t.zc[h] = _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.colsum + n0)), a_zp);
    t.s2[h] = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g.w_scales + n0), xs), inv);
    t.b2[h] = _mm256_mul_ps(g.bias ? _mm256_loadu_ps(g.bias + n0) : _mm256_setzero_ps(), inv);
  }
  return t;
}

// Folded requantization of MR rows x the full vector at n16 from sums[r * 2 + h]: both halves of a
// row clamped, then packed to 16 bytes with the zero point added in int16 (exact: the clamped values
// plus out_zp lie in the output's range), one store per row.
template <int MR>
__attribute__((always_inline)) inline void epilogue_folded(const GemmArgs& g, const FoldedConsts& c,
                                                           const FoldedTerms& t, const __m256i* sums, int64_t m0,
                                                           int64_t n16) {
  // Everything read once into locals: the stores below may alias g, c and t for the compiler.
  uint8_t* const out = static_cast<uint8_t*>(g.out) + m0 * g.ldc + n16;
  const int64_t ldc = g.ldc;
  const bool has_r = g.r != nullptr, u8 = c.u8;
  const __m256 q_lo = c.q_lo, q_hi = c.q_hi, r2 = c.r2;
  const __m256i zp16 = c.zp16;
  const __m256i zc[2] = {t.zc[0], t.zc[1]};
  const __m256 s2[2] = {t.s2[0], t.s2[1]}, b2[2] = {t.b2[0], t.b2[1]};
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m256i q[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r * 2 + h], zc[h])), s2[h], b2[h]);
      if (has_r) y = _mm256_fmadd_ps(residual(g, m0 + r, n16 + h * 8, 8), r2, y);
      q[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(y, q_lo), q_hi));
    }
    const __m256i w16 = _mm256_add_epi16(_mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8), zp16);
    const __m128i lo16 = _mm256_castsi256_si128(w16), hi16 = _mm256_extracti128_si256(w16, 1);
    const __m128i bytes = u8 ? _mm_packus_epi16(lo16, hi16) : _mm_packs_epi16(lo16, hi16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + r * ldc), bytes);
  }
}

// The epilogue of MR rows x one 16-column vector (columns n16..) from sums[r * 2 + h].
template <int MR>
__attribute__((always_inline)) inline void epilogue(const GemmArgs& g, const __m256i* sums, int64_t m0, int64_t n16) {
  const bool folded = requantizes_without_gelu(g);
  if (folded && n16 + 16 <= g.N) {
    epilogue_folded<MR>(g, folded_consts(g), folded_terms(g, n16), sums, m0, n16);
    return;
  }
  const float q_min = g.out_type == GemmOut::u8 ? 0.0f : -128.0f, q_max = g.out_type == GemmOut::u8 ? 255.0f : 127.0f;
  const float lo = q_min - static_cast<float>(g.out_zp);
  // Bounds of round(y / out_scale) relative to out_zp (relu: >= 0 where it folds).
  const __m256 q_lo = _mm256_set1_ps(g.post == GemmPost::relu ? std::max(lo, 0.0f) : lo);
  const __m256 q_lo_plain = _mm256_set1_ps(lo);
  const __m256 q_hi = _mm256_set1_ps(q_max - static_cast<float>(g.out_zp));
  const __m256i out_zp = _mm256_set1_epi32(g.out_zp);
  for (int h = 0; h < 2; ++h) {
    const int64_t n0 = n16 + h * 8;
    const int64_t valid = std::min<int64_t>(8, g.N - n0);
    if (valid <= 0) break;
    const __m256i mask = avx2::lane_mask(valid);
    const __m256i zp_colsum = _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.colsum + n0)),
                                                 _mm256_set1_epi32(g.a_zp));
    const __m256 scale = _mm256_mul_ps(load_f32(g.w_scales + n0, valid, mask), _mm256_set1_ps(g.x_scale));
    const __m256 bias = g.bias ? load_f32(g.bias + n0, valid, mask) : _mm256_setzero_ps();
    if (folded) {
      // Folded requantization, as in the AVX512 kernel: scale, bias and residual scale times 1 / out_scale.
      const __m256 inv = _mm256_set1_ps(g.out_inv_scale);
      const __m256 s2 = _mm256_mul_ps(scale, inv), b2 = _mm256_mul_ps(bias, inv);
      const __m256 r2 = _mm256_set1_ps(g.r_scale * g.out_inv_scale);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r * 2 + h], zp_colsum)), s2, b2);
        if (g.r) t = _mm256_fmadd_ps(residual(g, m0 + r, n0, valid), r2, t);
        const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, q_lo), q_hi)), out_zp);
        store_bytes(static_cast<uint8_t*>(g.out) + (m0 + r) * g.ldc + n0, q, valid);
      }
      continue;
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t m = m0 + r;
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r * 2 + h], zp_colsum)), scale, bias);
      if (g.r) y = _mm256_fmadd_ps(residual(g, m, n0, valid), _mm256_set1_ps(g.r_scale), y);
      if (g.post == GemmPost::relu) y = _mm256_max_ps(y, _mm256_setzero_ps());
      else if (g.post == GemmPost::gelu) y = gelu(y);
      switch (g.out_type) {
        case GemmOut::f32: {
          float* dst = static_cast<float*>(g.out) + m * g.ldc + n0;
          if (valid == 8) _mm256_storeu_ps(dst, y);
          else _mm256_maskstore_ps(dst, mask, y);
          break;
        }
        case GemmOut::bf16:
          store_bf16(static_cast<uint16_t*>(g.out) + m * g.ldc + n0, y, valid);
          break;
        case GemmOut::u8:
        case GemmOut::s8: {  // gelu with an integer output: the clamp in float, then round
          const __m256 t = _mm256_mul_ps(y, _mm256_set1_ps(g.out_inv_scale));
          const __m256i q =
              _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, q_lo_plain), q_hi)), out_zp);
          store_bytes(static_cast<uint8_t*>(g.out) + m * g.ldc + n0, q, valid);
          break;
        }
      }
    }
  }
}

// One tile: MR rows (m0..) x vector v of panel p (nvp vectors), prefetching a line of pf per k-group
// (pf_step apart) where pf is not null.
template <class Dot, int MR, bool I8>
void tile(const GemmArgs& g, int64_t m0, int64_t p, int64_t v, int64_t nvp, const int8_t* pf, int64_t pf_step) {
  __m256i sums[MR * 2];
  dot_tile<Dot, MR, I8>(g.a + m0 * g.lda, g.lda, g.b + p * kGemmPanel * gemm_kp(g.K) + v * 64, nvp * 64, g.K, sums,
                        pf, pf_step);
  epilogue<MR>(g, sums, m0, p * kGemmPanel + v * 16);
}

// Asks for the residual's bytes of rows [m_begin, m_end) x columns [n_begin, n_end) into L1: a row
// tile's epilogue reads them right after its K loop, where a miss stalls the tile (the tile's own
// output stores do not wait).
inline void prefetch_residual(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end) {
  for (int64_t m = m_begin; m < m_end; ++m) {
    const uint8_t* row = g.r + m * g.ldr;
    const uintptr_t first = reinterpret_cast<uintptr_t>(row + n_begin) & ~uintptr_t(63);
    for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(row + n_end); line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
  }
}

// The folded epilogue's terms of a panel's full vectors, worked out once per panel and block of rows.
struct PanelTerms {
  const FoldedConsts* c = nullptr;  // null where the epilogue does not fold
  int64_t full = 0;                 // vectors 0 .. full - 1 have their terms in t
  FoldedTerms t[kGemmPanel / 16];
};

// One row tile across a panel: MR rows (m0..) x the nvp vectors of panel p, the sweep's tiles
// i0 .. i0 + nvp - 1; tile i prefetches the i-th slice of the next panel (pf) where that lies within
// pf_bytes.
template <class Dot, int MR, bool I8>
void row_tile(const GemmArgs& g, const PanelTerms& e, int64_t m0, int64_t p, int64_t nvp, const int8_t* pf,
              int64_t pf_bytes, int64_t i0) {
  const int64_t kp = gemm_kp(g.K), slice = kp / 4 * 64;
  const int8_t* panel = g.b + p * kGemmPanel * kp;
  const uint8_t* a = g.a + m0 * g.lda;
  for (int64_t v = 0; v < nvp; ++v) {
    __m256i sums[MR * 2];
    const int64_t i = i0 + v;
    dot_tile<Dot, MR, I8>(a, g.lda, panel + v * 64, nvp * 64, g.K, sums, i * slice < pf_bytes ? pf + i * slice : nullptr,
                          64);
    const int64_t n16 = p * kGemmPanel + v * 16;
    if (v < e.full) epilogue_folded<MR>(g, *e.c, e.t[v], sums, m0, n16);
    else epilogue<MR>(g, sums, m0, n16);
  }
}

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t, int64_t, int64_t, const int8_t*, int64_t);
using RowTileFn = void (*)(const GemmArgs&, const PanelTerms&, int64_t, int64_t, int64_t, const int8_t*, int64_t,
                           int64_t);

template <class Dot, bool I8, int... R>
constexpr auto tile_table(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{&tile<Dot, R + 1, I8>...};
}

template <class Dot, bool I8, int... R>
constexpr auto row_tile_table(std::integer_sequence<int, R...>) {
  return std::array<RowTileFn, sizeof...(R)>{&row_tile<Dot, R + 1, I8>...};
}

template <class Dot, bool I8>
struct Tiles {
  static constexpr std::array<TileFn, Dot::kMaxRows> table =
      tile_table<Dot, I8>(std::make_integer_sequence<int, Dot::kMaxRows>{});
  static constexpr std::array<RowTileFn, Dot::kMaxRows> rows =
      row_tile_table<Dot, I8>(std::make_integer_sequence<int, Dot::kMaxRows>{});
};

template <class Dot>
void gemm(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t panel_begin, int64_t panel_end) {
  static const int64_t l2 = cpu::probe().l2_bytes > 0 ? cpu::probe().l2_bytes : int64_t(1) << 20;
  const auto& table = g.a_int8 ? Tiles<Dot, true>::table : Tiles<Dot, false>::table;
  const auto& rows_table = g.a_int8 ? Tiles<Dot, true>::rows : Tiles<Dot, false>::rows;
  const bool folded = requantizes_without_gelu(g);
  const FoldedConsts consts = folded ? folded_consts(g) : FoldedConsts{};
  // A residual of a quarter of the L2 or more is read from L3 or memory (written layers before):
  // asked for ahead. A smaller one is usually still in L2, where the requests cost more than they save.
  const bool prefetch_r = g.r && g.M * g.N >= l2 / 4;
  constexpr int kMaxRows = Dot::kMaxRows;
  // Two orders of a panel's tiles. Row tiles outer (each tile's rows stay in L1 across the panel's
  // vectors), unless the panel and the rows overflow L2 together where one 16-column vector and the
  // rows do not: then vectors outer (the rows and a vector stay in L2: a 3x3 conv over 512 channels
  // at 7 x 7 reads a 295 KB panel and 226 KB of rows, over a 512 KB L2). With `next` (a panel the
  // sweep reads from memory or L3) and at least two row tiles, the first tiles prefetch what runs
  // next a line per k-group: rows outer, tile i its i-th slice of the next panel; vectors outer,
  // the first row tile of a vector the next vector (of this panel, or the next panel's first). With
  // one row tile (a GEMV streaming the weight) the hardware prefetcher keeps up, as on AVX512. With a
  // large residual (prefetch_r), each row tile asks for the next one's residual bytes (prefetch_residual).
  const int64_t kp = gemm_kp(g.K), kgroups = kp / 4;
  sweep(g, m_begin, m_end, panel_begin, panel_end, kMaxRows, [&](int64_t p, int64_t mb, int64_t me, NextPanel next) {
    const int64_t nvp = (std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel) + 15) / 16;
    const bool prefetch = me - mb > kMaxRows;
    const int64_t rows = (me - mb) * g.K, budget = l2 / 4 * 3;
    if (prefetch && nvp * 16 * kp + rows > budget && 16 * kp + rows <= budget) {
      const int8_t* panel = g.b + p * kGemmPanel * kp;
      for (int64_t v = 0; v < nvp; ++v) {
        const int8_t* pf = v + 1 < nvp ? panel + (v + 1) * 64 : next.p;
        const int64_t step = v + 1 < nvp ? nvp * 64 : next.bytes / kgroups;
        const int64_t n0 = p * kGemmPanel + v * 16, n1 = std::min<int64_t>(g.N, n0 + 16);
        for (int64_t m = mb; m < me; m += kMaxRows) {
          if (prefetch_r) prefetch_residual(g, m == mb ? m : m + kMaxRows, std::min(me, m + 2 * kMaxRows), n0, n1);
          table[std::min<int64_t>(kMaxRows, me - m) - 1](g, m, p, v, nvp, m == mb ? pf : nullptr, step);
        }
      }
      return;
    }
    const int64_t pf_bytes = prefetch ? next.bytes : 0;
    const int64_t n_begin = p * kGemmPanel, n_end = std::min<int64_t>(g.N, n_begin + kGemmPanel);
    PanelTerms terms;
    if (folded) {
      terms.c = &consts;
      terms.full = std::min<int64_t>(nvp, (g.N - n_begin) / 16);
      for (int64_t v = 0; v < terms.full; ++v) terms.t[v] = folded_terms(g, n_begin + v * 16);
    }
    int64_t i = 0;
    for (int64_t m = mb; m < me; m += kMaxRows, i += nvp) {
      // the next row tile's residual, while this one runs (the first tile's asked for just before)
      if (prefetch_r) prefetch_residual(g, m == mb ? m : m + kMaxRows, std::min(me, m + 2 * kMaxRows), n_begin, n_end);
      rows_table[std::min<int64_t>(kMaxRows, me - m) - 1](g, terms, m, p, nvp, next.p, pf_bytes, i);
    }
  });
}

}  // namespace
}  // namespace qbackend::kernels
