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

namespace {

// Lanes d .. d + 15 of a row (the lanes under m; 0 elsewhere): fp32, or int8 widened exactly.
inline __m512 row_lanes(const float* row, int64_t d, __mmask16 m) { return _mm512_maskz_loadu_ps(m, row + d); }
inline __m512 row_lanes(const int8_t* row, int64_t d, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + d)));
}

// Vectors of an output row one pass over the value rows computes: independent accumulators, so the
// pass is not bound by one fused multiply-add's latency per position.
constexpr int64_t kValueVectors = 4;

// o[d0 .. d0 + NV * W) (lanes below D) = inv * sum_s w[s] v_s[d0 ..], each lane's sum in position order;
// every one of the NV vectors has a lane below D.
template <int NV, typename T>
inline void weighted_rows(const float* w, const T* v, int64_t v_ss, int64_t S, int64_t d0, int64_t D, __m512 inv,
                          float* o) {
  using avx512::W;
  __m512 acc[NV];
  __mmask16 m[NV];
  for (int j = 0; j < NV; ++j) {
    acc[j] = _mm512_setzero_ps();
    m[j] = avx512::tail_mask(D - d0 - j * W);
  }
  for (int64_t s = 0; s < S; ++s) {
    const __m512 ws = _mm512_set1_ps(w[s]);
    const T* row = v + s * v_ss;
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_fmadd_ps(ws, row_lanes(row, d0 + j * W, m[j]), acc[j]);
  }
  for (int j = 0; j < NV; ++j) avx512::store(o + d0 + j * W, m[j], _mm512_mul_ps(acc[j], inv));
}

// The kernel over rows of type T (float, or int8 with per-row scales ksc / vsc; nullptr for float).
template <typename T>
void heads(const DecodeAttention& p, const T* k, const float* ksc, const T* v, const float* vsc, int64_t b,
           int64_t kvh, float* scratch) {
  using avx512::W;
  const int64_t R = p.H / p.KV, S = p.S, D = p.D;
  const float* q = p.q + (b * p.H + kvh * R) * D;
  float* out = p.out + (b * p.H + kvh * R) * D;
  // scores[r * S + s] = scale * q_r . k_s (times the row's scale for int8 rows)
  for (int64_t s = 0; s < S; ++s) {
    const T* ks = k + s * p.k_ss;
    const float row_scale = ksc ? ksc[s] * p.scale : p.scale;
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + r * D;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += W) {
        const __mmask16 m = avx512::tail_mask(D - d);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qr + d), row_lanes(ks, d, m), acc);
      }
      scratch[r * S + s] = _mm512_reduce_add_ps(acc) * row_scale;
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
      vsum = _mm512_add_ps(vsum, e);
      // the weights the value rows take: e, times the row's scale for int8 rows
      avx512::store(sc + s, m, vsc ? _mm512_mul_ps(e, _mm512_maskz_loadu_ps(m, vsc + s)) : e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t d = 0; d < D; d += kValueVectors * W) {
      switch (std::min<int64_t>(kValueVectors, (D - d + W - 1) / W)) {
        case 4: weighted_rows<4>(sc, v, p.v_ss, S, d, D, inv, out + r * D); break;
        case 3: weighted_rows<3>(sc, v, p.v_ss, S, d, D, inv, out + r * D); break;
        case 2: weighted_rows<2>(sc, v, p.v_ss, S, d, D, inv, out + r * D); break;
        default: weighted_rows<1>(sc, v, p.v_ss, S, d, D, inv, out + r * D); break;
      }
    }
  }
}

}  // namespace

void decode_attention_avx512(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch) {
  if (p.k8) {
    heads(p, p.k8 + b * p.k_sb + kvh * p.k_sh, p.k_scale + b * p.ks_sb + kvh * p.ks_sh,
          p.v8 + b * p.v_sb + kvh * p.v_sh, p.v_scale + b * p.vs_sb + kvh * p.vs_sh, b, kvh, scratch);
  } else {
    heads<float>(p, p.k + b * p.k_sb + kvh * p.k_sh, nullptr, p.v + b * p.v_sb + kvh * p.v_sh, nullptr, b, kvh,
                 scratch);
  }
}

}  // namespace qbackend::kernels
