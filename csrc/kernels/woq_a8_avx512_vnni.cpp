// AVX512-VNNI W4A8 and W8A8 products (woq_a8_kernels.h). W4A8: 128 k of four weight rows a step, their nibbles split
// by two masks into the even and the odd k, each multiplied with the matching int8 activations by
// one vpdpbusd (u8 x s8, exact int32 sums of each 8 k), then scaled per lane (weight group scale x
// activation block scale) into float32. Only this file is compiled for AVX512-VNNI.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/targets.h"
#include "kernels/woq_a8_kernels.h"

QB_TARGET(QB_ISA_AVX512_VNNI)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace qbackend::kernels {
namespace {

template <int MR>
void pass_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* const wr[4], const float* const sc[4], int64_t K,
             int64_t G, float acc_out[MR][4]) {
  const int64_t nbytes = (K + 1) / 2, ng = q.ng;
  const __m128i shift = _mm_cvtsi32_si128(__builtin_ctzll(uint64_t(G)));
  const __m512i lane_k = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nbytes; b0 += 64) {
    const __mmask64 bm = nbytes - b0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (nbytes - b0)) - 1;
    const int64_t k0 = 2 * b0, g0 = k0 >> __builtin_ctzll(uint64_t(G));
    const int64_t count = std::min<int64_t>(16, ng - g0);
    const __mmask16 gm = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
    // each lane's weight group, relative to g0
    const __m512i gidx = _mm512_sub_epi32(_mm512_srl_epi32(_mm512_add_epi32(_mm512_set1_epi32(int(k0)), lane_k), shift),
                                          _mm512_set1_epi32(int(g0)));
    __m512i lo[4], hi[4];
    __m512 sv[4];
    for (int j = 0; j < 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 4 * nbytes + b0), _MM_HINT_T0);  // the next pass's rows
      const __m512i v = _mm512_maskz_loadu_epi8(bm, wr[j] + b0);
      lo[j] = _mm512_and_si512(v, low);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      sv[j] = _mm512_permutexvar_ps(gidx, _mm512_maskz_loadu_ps(gm, sc[j] + g0));
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t row = m0 + i;
      const __m512i xe = _mm512_loadu_si512(q.even + row * q.ldq + b0);
      const __m512i xo = _mm512_loadu_si512(q.odd + row * q.ldq + b0);
      const __m512 d = _mm512_loadu_ps(q.lane_scale + row * q.ldl + b0 / 4);
      for (int j = 0; j < 4; ++j) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], xe), hi[j], xo);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sv[j], d), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

// 64 k of four int8 weight rows a step: the sign bit flipped makes them w + 128 (u8), whose products
// with xq vpdpbusd sums per 4 k; the lane's 128 * sum(xq) taken off leaves the exact sum of w * xq.
template <int MR>
void pass_s8a8(const BlockQuantizedRows8& q, int64_t m0, const int8_t* const wr[4], int64_t K, float acc_out[MR][4]) {
  const __m512i flip = _mm512_set1_epi8(int8_t(0x80));
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 64) {
    // beyond K the weight reads 0 (128 after the flip) against xq = 0
    const __mmask64 km = K - k0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (K - k0)) - 1;
    __m512i wu[4];
    for (int j = 0; j < 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 4 * K + k0), _MM_HINT_T0);  // the next pass's rows
      wu[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(km, wr[j] + k0), flip);
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t row = m0 + i;
      const __m512i xv = _mm512_loadu_si512(q.xq + row * q.ldq + k0);
      const __m512i off = _mm512_loadu_si512(q.lane_offset + row * q.ldl + k0 / 4);
      const __m512 d = _mm512_loadu_ps(q.lane_scale + row * q.ldl + k0 / 4);
      for (int j = 0; j < 4; ++j) {
        const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wu[j], xv), off);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc_out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

#include "kernels/woq_a8_rows_impl.h"

constexpr WoqA8Kernels kTable{"avx512_vnni", &gemv_u4a8, &gemv_s8a8};

}  // namespace

const WoqA8Kernels& woq_a8_kernels_avx512_vnni() { return kTable; }

}  // namespace qbackend::kernels
