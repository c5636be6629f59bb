// AVX2+FMA quantize/dequantize kernels: 8 lanes; tails go through a zero-padded stack block so
// they use the very same instructions. Only this file is compiled for AVX2 (pragma below, after
// the includes); call it only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/quantize_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX2)
#include "kernels/interleave_impl.h"

namespace qbackend::kernels {
namespace {

constexpr int64_t W = 8;
constexpr int64_t QB = 32;  // quantize block: 4 vectors packed into 32 bytes
constexpr int64_t DB = 8;   // dequantize block

inline __m256 load_x(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_x(const uint16_t* p) {  // bf16 bits -> fp32 (exact)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline __m256i load_q(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i load_q(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// 4 x 8 int32 (already in Q's range, so the saturating packs are exact) -> 32 bytes in order.
template <typename Q>
inline void store_q32(Q* p, __m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  const __m256i v = std::is_same_v<Q, uint8_t> ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(v, order));
}

inline void store_y(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store_y(uint16_t* p, __m256 v) {  // fp32 -> bf16, round to nearest even (never NaN here)
  __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
}

// clamp(rne(x / scale), lo, hi) + zp with lo = qmin - zp, hi = qmax - zp; NaN -> 0 before the clamp.
inline __m256i quant(__m256 x, __m256 scale, __m256 lo, __m256 hi, __m256i zp) {
  __m256 v = _mm256_div_ps(x, scale);
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
  v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
  return _mm256_add_epi32(_mm256_cvtps_epi32(v), zp);
}

inline __m256 dequant(__m256i q, __m256 scale, __m256i zp) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, zp)), scale);
}

// Runs `block(x, q, params_offset)` over full blocks of B, then once over a zero-padded copy of
// the tail (In/Out element types), copying back only the valid part.
template <int64_t B, typename In, typename Out, typename Block>
inline void blocked(const In* x, Out* y, int64_t n, Block block) {
  int64_t i = 0;
  for (; i + B <= n; i += B) block(x + i, y + i, i);
  if (i < n) {
    In xb[B] = {};
    Out yb[B];
    std::memcpy(xb, x + i, (n - i) * sizeof(In));
    block(xb, yb, i);
    std::memcpy(y + i, yb, (n - i) * sizeof(Out));
  }
}

template <typename In, typename Q>
struct Quant {
  static void run(const In* x, Q* q, int64_t n, float scale, int32_t zp) {
    const __m256 s = _mm256_set1_ps(scale);
    const __m256 lo = _mm256_set1_ps(float(QRange<Q>::min - zp));
    const __m256 hi = _mm256_set1_ps(float(QRange<Q>::max - zp));
    const __m256i z = _mm256_set1_epi32(zp);
    blocked<QB>(x, q, n, [&](const In* xp, Q* qp, int64_t) {
      store_q32(qp, quant(load_x(xp), s, lo, hi, z), quant(load_x(xp + W), s, lo, hi, z),
                quant(load_x(xp + 2 * W), s, lo, hi, z), quant(load_x(xp + 3 * W), s, lo, hi, z));
    });
  }
};

template <typename In, typename Q>
struct QuantV {
  static void run(const In* x, Q* q, int64_t n, const float* scale, const int32_t* zp) {
    const __m256i qmin = _mm256_set1_epi32(QRange<Q>::min), qmax = _mm256_set1_epi32(QRange<Q>::max);
    // In the tail the parameters are read from padded copies as well.
    float sb[QB];
    int32_t zb[QB];
    blocked<QB>(x, q, n, [&](const In* xp, Q* qp, int64_t off) {
      const float* sp = scale + off;
      const int32_t* zpp = zp + off;
      if (off + QB > n) {
        for (int64_t j = 0; j < QB; ++j) {
          sb[j] = off + j < n ? scale[off + j] : 1.0f;
          zb[j] = off + j < n ? zp[off + j] : 0;
        }
        sp = sb;
        zpp = zb;
      }
      __m256i r[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 s = _mm256_loadu_ps(sp + k * W);
        const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(zpp + k * W));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(qmin, z));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(qmax, z));
        r[k] = quant(load_x(xp + k * W), s, lo, hi, z);
      }
      store_q32(qp, r[0], r[1], r[2], r[3]);
    });
  }
};

template <typename Q, typename Out>
struct Dequant {
  static void run(const Q* q, Out* y, int64_t n, float scale, int32_t zp) {
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i z = _mm256_set1_epi32(zp);
    blocked<DB>(q, y, n, [&](const Q* qp, Out* yp, int64_t) { store_y(yp, dequant(load_q(qp), s, z)); });
  }
};

template <typename Q, typename Out>
struct DequantV {
  static void run(const Q* q, Out* y, int64_t n, const float* scale, const int32_t* zp) {
    float sb[DB];
    int32_t zb[DB];
    blocked<DB>(q, y, n, [&](const Q* qp, Out* yp, int64_t off) {
      const float* sp = scale + off;
      const int32_t* zpp = zp + off;
      if (off + DB > n) {
        for (int64_t j = 0; j < DB; ++j) {
          sb[j] = off + j < n ? scale[off + j] : 1.0f;
          zb[j] = off + j < n ? zp[off + j] : 0;
        }
        sp = sb;
        zpp = zb;
      }
      const __m256 s = _mm256_loadu_ps(sp);
      const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(zpp));
      store_y(yp, dequant(load_q(qp), s, z));
    });
  }
};

constexpr QuantizeKernels kTable = make_quantize_kernels<Quant, QuantV, Dequant, DequantV>("avx2", interleave_u8_sse);

}  // namespace

const QuantizeKernels& quantize_kernels_avx2() { return kTable; }

}  // namespace qbackend::kernels
