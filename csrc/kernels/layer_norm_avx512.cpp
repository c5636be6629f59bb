// AVX512 (F/BW/VL/DQ) fused residual add + LayerNorm + quantize, one row per call
// (kernels/layer_norm_kernels.h). Only this file is compiled for AVX512 (pragma below, after the
// includes); call it only when qbackend::cpu::has(qbackend::cpu::Isa::Avx512).

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/layer_norm_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512)
#include "kernels/avx512_common.h"

namespace qbackend::kernels {

using avx512::store;
using avx512::tail_mask;
using avx512::W;

void layer_norm_quantize_row_avx512(const LayerNormQuantRow& p, const float* x, const float* r, float* y, void* q) {
  const int64_t C = p.C;
  // pass 1: s = x + r into y, and its sum; pass 2: the biased variance around the mean. Four
  // accumulators in registers over runs of 64 values, so the adds do not wait on each other.
  auto sum_row = [&](auto&& value) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 4 * W <= C; c += 4 * W) {
      a0 = _mm512_add_ps(a0, value(c, __mmask16(0xFFFF)));
      a1 = _mm512_add_ps(a1, value(c + W, __mmask16(0xFFFF)));
      a2 = _mm512_add_ps(a2, value(c + 2 * W, __mmask16(0xFFFF)));
      a3 = _mm512_add_ps(a3, value(c + 3 * W, __mmask16(0xFFFF)));
    }
    for (; c < C; c += W) a0 = _mm512_add_ps(a0, value(c, tail_mask(C - c)));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  };
  const float mean = sum_row([&](int64_t c, __mmask16 m) {
    __m512 v = _mm512_maskz_loadu_ps(m, x + c);
    if (r) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + c));
    store(y + c, m, v);
    return v;
  }) / static_cast<float>(C);
  const __m512 vmean = _mm512_set1_ps(mean);
  const float var = sum_row([&](int64_t c, __mmask16 m) {
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, y + c), vmean);
    return _mm512_mul_ps(d, d);
  }) / static_cast<float>(C);
  const __m512 rstd = _mm512_set1_ps(1.0f / std::sqrt(var + p.eps));
  // pass 3: normalise, affine, store y; quantize per channel, store q
  const __m512i zp = _mm512_set1_epi32(p.zp);
  const __m512 lo = _mm512_set1_ps(float(p.qmin - p.zp)), hi = _mm512_set1_ps(float(p.qmax - p.zp));
  for (int64_t c = 0; c < C; c += W) {
    const __mmask16 m = tail_mask(C - c);
    __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, y + c), vmean), rstd);
    if (p.w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, p.w + c));
    if (p.b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.b + c));
    store(y + c, m, v);
    const __m512i qi = avx512::quantize(v, _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, p.scale + c), lo, hi, zp);
    store(static_cast<char*>(q) + c, m, _mm512_cvtepi32_epi8(qi));
  }
}

}  // namespace qbackend::kernels
