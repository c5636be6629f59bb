// float16 group values (F16, woq_kernels.h) to float32 lanes with F16C's vcvtph2ps, the same floats as
// half_to_float (half_float.h). For the SIMD weight-only units: include it AFTER the translation unit's QB_TARGET, which
// must name F16C (QB_ISA_F16C); in an anonymous namespace, so each unit compiles its own copy for its
// own target.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/woq_kernels.h"

namespace qbackend::kernels {
namespace {

// The four float16 values at p (8 bytes) as float32.
inline __m128 f16x4(const F16* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The eight float16 values at p (16 bytes) as float32.
inline __m256 f16x8(const F16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The n (a multiple of 4) float16 values at p as float32 into out.
inline void f16_to_float_n(const F16* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f16x8(p + i));
  if (i < n) _mm_storeu_ps(out + i, f16x4(p + i));
}

}  // namespace
}  // namespace qbackend::kernels
