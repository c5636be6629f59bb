// Attention for one decoding step (decode_attention_kernels.h) on AVX512 (F/BW/VL/DQ). Only this
// file is compiled for AVX512 (pragma below); call it only when qbackend::cpu::has(Isa::Avx512).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/decode_attention_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512)
#include "kernels/avx512_common.h"

namespace qbackend::kernels {

size_t decode_attention_scratch_floats(const DecodeAttention& p) {
  return static_cast<size_t>(p.H / std::max<int64_t>(p.KV, 1)) * static_cast<size_t>(p.S);
}

void decode_attention_avx512(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch) {
  using avx512::W;
  const int64_t R = p.H / p.KV, S = p.S, D = p.D;
  const float* q = p.q + (b * p.H + kvh * R) * D;
  const float* k = p.k + b * p.k_sb + kvh * p.k_sh;
  const float* v = p.v + b * p.v_sb + kvh * p.v_sh;
  float* out = p.out + (b * p.H + kvh * R) * D;
  // scores[r * S + s] = scale * q_r . k_s
  for (int64_t s = 0; s < S; ++s) {
    const float* ks = k + s * p.k_ss;
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + r * D;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += W) {
        const __mmask16 m = avx512::tail_mask(D - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qr + d), _mm512_maskz_loadu_ps(m, ks + d), acc);
      }
      scratch[r * S + s] = _mm512_reduce_add_ps(acc) * p.scale;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* sc = scratch + r * S;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t s = 0; s < S; s += W)
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), avx512::tail_mask(S - s), sc + s));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t s = 0; s < S; s += W) {
      const __mmask16 m = avx512::tail_mask(S - s);
      const __m512 e = _mm512_maskz_mov_ps(m, avx512::exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + s), mx)));
      avx512::store(sc + s, m, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    float* o = out + r * D;
    for (int64_t d = 0; d < D; d += W) {
      const __mmask16 m = avx512::tail_mask(D - d);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; ++s)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(sc[s]), _mm512_maskz_loadu_ps(m, v + s * p.v_ss + d), acc);
      avx512::store(o + d, m, _mm512_mul_ps(acc, inv));
    }
  }
}

}  // namespace qbackend::kernels
