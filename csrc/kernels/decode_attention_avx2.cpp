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
#include "kernels/avx2_common.h"

namespace qbackend::kernels {
namespace {

constexpr int64_t W = 8;  // fp32 lanes

// Lanes d .. d + 7 of a row, 0 past its n = D - d remaining values: fp32, or int8 widened exactly.
inline __m256 row_lanes(const float* row, int64_t d, int64_t n) {
  return n >= W ? _mm256_loadu_ps(row + d) : _mm256_maskload_ps(row + d, avx2::lane_mask(n));
}
inline __m256 row_lanes(const int8_t* row, int64_t d, int64_t n) {
  int64_t bytes = 0;
  std::memcpy(&bytes, row + d, static_cast<size_t>(std::min<int64_t>(n, W)));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
}

// Vectors of an output row one pass over the value rows computes: independent accumulators, so the
// pass is not bound by one fused multiply-add's latency per position.
constexpr int64_t kValueVectors = 4;

// o[d0 .. d0 + NV * W) (lanes below D) = inv * sum_s w[s] v_s[d0 ..], each lane's sum in position order;
// every one of the NV vectors has a lane below D.
template <int NV, typename T>
inline void weighted_rows(const float* w, const T* v, int64_t v_ss, int64_t S, int64_t d0, int64_t D, __m256 inv,
                          float* o) {
  __m256 acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const __m256 ws = _mm256_set1_ps(w[s]);
    const T* row = v + s * v_ss;
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(ws, row_lanes(row, d0 + j * W, D - d0 - j * W), acc[j]);
  }
  for (int j = 0; j < NV; ++j)
    _mm256_maskstore_ps(o + d0 + j * W, avx2::lane_mask(D - d0 - j * W), _mm256_mul_ps(acc[j], inv));
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
      scratch[r * S + s] = avx2::hsum(acc) * row_scale;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* sc = scratch + r * S;
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = neg_inf;
    for (int64_t s = 0; s < S; s += W) {
      const __m256i m = avx2::lane_mask(S - s);
      vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(sc + s, m), _mm256_castsi256_ps(m)));
    }
    const __m256 mx = _mm256_set1_ps(avx2::hmax(vmax));
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t s = 0; s < S; s += W) {
      const __m256i m = avx2::lane_mask(S - s);
      const __m256 e = _mm256_and_ps(avx2::exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(sc + s, m), mx)),
                                     _mm256_castsi256_ps(m));
      vsum = _mm256_add_ps(vsum, e);
      // the weights the value rows take: e, times the row's scale for int8 rows
      _mm256_maskstore_ps(sc + s, m, vsc ? _mm256_mul_ps(e, _mm256_maskload_ps(vsc + s, m)) : e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / avx2::hsum(vsum));
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
