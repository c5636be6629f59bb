// AVX512 (F/BW/VL/DQ) quantize/dequantize kernels: 16 lanes, masked loads/stores for the tail.
// Only this file is compiled for AVX512 (pragma below, after the includes); call it only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512).


#include <immintrin.h>

#include <cstdint>

#include "kernels/quantize_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512)
#include "kernels/interleave_impl.h"
#include "kernels/avx512_common.h"

namespace qbackend::kernels {
namespace {

using avx512::store;
using avx512::tail_mask;
using avx512::W;

inline __m512 load_x(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_x(const uint16_t* p, __mmask16 m) { return avx512::widen_bf16(p, m); }

inline __m512i load_q(const uint8_t* p, __mmask16 m) { return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p)); }
inline __m512i load_q(const int8_t* p, __mmask16 m) { return _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)); }

// Values are already clamped to the range of Q, so truncating to 8 bits is exact for both types.
template <typename Q>
inline void store_q(Q* p, __m512i v, __mmask16 m) { store(p, m, _mm512_cvtepi32_epi8(v)); }

inline void store_y(float* p, __m512 v, __mmask16 m) { store(p, m, v); }
inline void store_y(uint16_t* p, __m512 v, __mmask16 m) { store(p, m, avx512::round_bf16(v)); }

inline __m512 dequant(__m512i q, __m512 scale, __m512i zp) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zp)), scale);
}

template <typename In, typename Q>
struct Quant {
  static void run(const In* x, Q* q, int64_t n, float scale, int32_t zp) {
    const __m512 s = _mm512_set1_ps(scale);
    const __m512 lo = _mm512_set1_ps(float(QRange<Q>::min - zp));
    const __m512 hi = _mm512_set1_ps(float(QRange<Q>::max - zp));
    const __m512i z = _mm512_set1_epi32(zp);
    for (int64_t i = 0; i < n; i += W) {
      const __mmask16 m = tail_mask(n - i);
      store_q(q + i, avx512::quantize(load_x(x + i, m), s, lo, hi, z), m);
    }
  }
};

template <typename In, typename Q>
struct QuantV {
  static void run(const In* x, Q* q, int64_t n, const float* scale, const int32_t* zp) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i qmin = _mm512_set1_epi32(QRange<Q>::min), qmax = _mm512_set1_epi32(QRange<Q>::max);
    for (int64_t i = 0; i < n; i += W) {
      const __mmask16 m = tail_mask(n - i);
      const __m512 s = _mm512_mask_loadu_ps(one, m, scale + i);
      const __m512i z = _mm512_maskz_loadu_epi32(m, zp + i);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(qmin, z));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(qmax, z));
      store_q(q + i, avx512::quantize(load_x(x + i, m), s, lo, hi, z), m);
    }
  }
};

template <typename Q, typename Out>
struct Dequant {
  static void run(const Q* q, Out* y, int64_t n, float scale, int32_t zp) {
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i z = _mm512_set1_epi32(zp);
    for (int64_t i = 0; i < n; i += W) {
      const __mmask16 m = tail_mask(n - i);
      store_y(y + i, dequant(load_q(q + i, m), s, z), m);
    }
  }
};

template <typename Q, typename Out>
struct DequantV {
  static void run(const Q* q, Out* y, int64_t n, const float* scale, const int32_t* zp) {
    for (int64_t i = 0; i < n; i += W) {
      const __mmask16 m = tail_mask(n - i);
      const __m512 s = _mm512_maskz_loadu_ps(m, scale + i);
      const __m512i z = _mm512_maskz_loadu_epi32(m, zp + i);
      store_y(y + i, dequant(load_q(q + i, m), s, z), m);
    }
  }
};

constexpr QuantizeKernels kTable = make_quantize_kernels<Quant, QuantV, Dequant, DequantV>("avx512", interleave_u8_sse);

}  // namespace

const QuantizeKernels& quantize_kernels_avx512() { return kTable; }

}  // namespace qbackend::kernels
