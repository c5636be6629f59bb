// Attention for one decoding step (decode_attention_kernels.h) on AVX2 with FMA: the AVX512 kernel's
// arithmetic on 8 lanes. Only this file is compiled for AVX2 (pragma below); call it only when
// qbackend::cpu::has(Isa::Avx2).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/decode_attention_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX2)

namespace qbackend::kernels {
namespace {

constexpr int64_t W = 8;  // fp32 lanes

// The mask of the first n lanes (n >= 8: all of them).
inline __m256i lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, W))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Lanes d .. d + 7 of a row, 0 past its n = D - d remaining values: fp32, or int8 widened exactly.
inline __m256 row_lanes(const float* row, int64_t d, int64_t n) {
  return n >= W ? _mm256_loadu_ps(row + d) : _mm256_maskload_ps(row + d, lanes(n));
}
inline __m256 row_lanes(const int8_t* row, int64_t d, int64_t n) {
  int64_t bytes = 0;
  std::memcpy(&bytes, row + d, static_cast<size_t>(std::min<int64_t>(n, W)));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// exp(x) for x <= 0 (NaN stays NaN): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its degree-7 Taylor
// polynomial, times 2^n built in the exponent bits. Inputs below -87 are taken as -87 (e^-87 ~ 1.6e-38:
// the weight of a score that far below the maximum, whose own weight is 1), so 2^n stays a normal float.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // the second operand is returned when it is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// The kernel over rows of type T (float, or int8 with per-row scales ksc / vsc; nullptr for float).
template <typename T>
void heads(const DecodeAttention& p, const T* k, const float* ksc, const T* v, const float* vsc, int64_t b,
           int64_t kvh, float* scratch) {
  const int64_t R = p.H / p.KV, S = p.S, D = p.D;
  const float* q = p.q + (b * p.H + kvh * R) * D;
  float* out = p.out + (b * p.H + kvh * R) * D;
  // scores[r * S + s] = scale * q_r . k_s (times the row's scale for int8 rows)
  for (int64_t s = 0; s < S; ++s) {
    const T* ks = k + s * p.k_ss;
    const float row_scale = ksc ? ksc[s] * p.scale : p.scale;
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + r * D;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += W) acc = _mm256_fmadd_ps(row_lanes(qr, d, D - d), row_lanes(ks, d, D - d), acc);
      scratch[r * S + s] = hsum(acc) * row_scale;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* sc = scratch + r * S;
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = neg_inf;
    for (int64_t s = 0; s < S; s += W) {
      const __m256i m = lanes(S - s);
      vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(sc + s, m), _mm256_castsi256_ps(m)));
    }
    const __m256 mx = _mm256_set1_ps(hmax(vmax));
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t s = 0; s < S; s += W) {
      const __m256i m = lanes(S - s);
      const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(sc + s, m), mx)),
                                     _mm256_castsi256_ps(m));
      vsum = _mm256_add_ps(vsum, e);
      // the weights the value rows take: e, times the row's scale for int8 rows
      _mm256_maskstore_ps(sc + s, m, vsc ? _mm256_mul_ps(e, _mm256_maskload_ps(vsc + s, m)) : e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(vsum));
    float* o = out + r * D;
    for (int64_t d = 0; d < D; d += W) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t s = 0; s < S; ++s)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(sc[s]), row_lanes(v + s * p.v_ss, d, D - d), acc);
      _mm256_maskstore_ps(o + d, lanes(D - d), _mm256_mul_ps(acc, inv));
    }
  }
}

}  // namespace

void decode_attention_avx2(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch) {
  if (p.k8) {
    heads(p, p.k8 + b * p.k_sb + kvh * p.k_sh, p.k_scale + b * p.ks_sb + kvh * p.ks_sh,
          p.v8 + b * p.v_sb + kvh * p.v_sh, p.v_scale + b * p.vs_sb + kvh * p.vs_sh, b, kvh, scratch);
  } else {
    heads<float>(p, p.k + b * p.k_sb + kvh * p.k_sh, nullptr, p.v + b * p.v_sb + kvh * p.v_sh, nullptr, b, kvh,
                 scratch);
  }
}

}  // namespace qbackend::kernels
