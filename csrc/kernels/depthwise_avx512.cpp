// The native depthwise conv (contract: depthwise_kernels.h) on AVX512: blocks of up to 4 output
// pixels x 64 channels accumulate (x - x_zp) * w in fp32 registers (exact: integer sums below
// 2^24) from a ring of input rows converted once per thread, then go through the native GEMM's
// epilogue (gemm_avx512_vnni_impl.h) as int32 sums. Call only when has(Isa::Avx512Vnni).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "kernels/depthwise_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512_VNNI)

#include "kernels/gemm_avx512_vnni_impl.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {
namespace {

constexpr int64_t kMaxRing = 256;  // input rows one output row spans: (KH - 1) * dh + 1 (checked by the op)
constexpr int kPixels = 4;         // output pixels per register block

int64_t ring_rows(const DepthwiseArgs& a) { return (a.KH - 1) * a.dh + 1; }
int64_t padded_width(const DepthwiseArgs& a) { return a.W + 2 * a.pw; }

// Input row (n, ih) as fp32 (x - x_zp), zero in the padding columns and channels, into dst
// [padded_width][Cp].
void convert_row(const DepthwiseArgs& a, int64_t n, int64_t ih, float* dst) {
  const int64_t Cp = depthwise_cp(a.C), Wp = padded_width(a);
  std::memset(dst, 0, static_cast<size_t>(a.pw * Cp) * sizeof(float));
  std::memset(dst + (a.pw + a.W) * Cp, 0, static_cast<size_t>((Wp - a.pw - a.W) * Cp) * sizeof(float));
  const __m512 zp = _mm512_set1_ps(static_cast<float>(a.x_zp));
  const uint8_t* src = a.x + (n * a.H + ih) * a.W * a.C;
  for (int64_t iw = 0; iw < a.W; ++iw) {
    const uint8_t* s = src + iw * a.C;
    float* d = dst + (a.pw + iw) * Cp;
    for (int64_t c = 0; c < Cp; c += 16) {
      const int64_t valid = std::min<int64_t>(16, a.C - c);
      __m128i b;
      if (valid == 16) b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c));
      else if (valid > 0) b = _mm_maskz_loadu_epi8(avx512::tail_mask(valid), s + c);
      else b = _mm_setzero_si128();
      const __m512i v = a.x_int8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
      __m512 f = _mm512_sub_ps(_mm512_cvtepi32_ps(v), zp);
      if (valid < 16) f = _mm512_maskz_mov_ps(valid > 0 ? avx512::tail_mask(valid) : __mmask16(0), f);
      _mm512_storeu_ps(d + c, f);
    }
  }
}

// MR output pixels (ow0.., pixel index m0..) x NV 16-channel vectors (c0..) of one output row whose
// input rows are rows[0 .. KH).
template <int MR, int NV>
void block(const DepthwiseArgs& a, const float* const* rows, int64_t m0, int64_t ow0, int64_t c0) {
  const int64_t Cp = depthwise_cp(a.C);
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kh = 0; kh < a.KH; ++kh) {
    const float* rp = rows[kh] + c0;
    for (int64_t kw = 0; kw < a.KW; ++kw) {
      const float* wp = a.w + (kh * a.KW + kw) * Cp + c0;
      __m512 wv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(wp + v * 16);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const float* xp = rp + ((ow0 + r) * a.sw + kw * a.dw) * Cp;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + v * 16), wv[v], acc[r][v]);
      }
    }
  }
  __m512 sums[MR * NV];  // exact integers in fp32
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) sums[r * NV + v] = acc[r][v];
  epilogue<MR, NV, __m512>(a.epi, sums, m0, c0, 0);
}

template <int MR>
void block_nv(const DepthwiseArgs& a, const float* const* rows, int64_t m0, int64_t ow0, int64_t c0, int64_t nv) {
  switch (nv) {
    case 1: block<MR, 1>(a, rows, m0, ow0, c0); break;
    case 2: block<MR, 2>(a, rows, m0, ow0, c0); break;
    case 3: block<MR, 3>(a, rows, m0, ow0, c0); break;
    default: block<MR, 4>(a, rows, m0, ow0, c0); break;
  }
}

}  // namespace

size_t depthwise_scratch_floats(const DepthwiseArgs& a) {
  return static_cast<size_t>((ring_rows(a) + 1) * padded_width(a) * depthwise_cp(a.C));
}

void depthwise_rows_avx512(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  const int64_t Cp = depthwise_cp(a.C), row_floats = padded_width(a) * Cp, R = ring_rows(a);
  float* zero_row = scratch + R * row_floats;  // input rows above and below the image
  std::memset(zero_row, 0, static_cast<size_t>(row_floats) * sizeof(float));
  std::array<int64_t, kMaxRing> tag;  // the (n * H + ih) each ring slot holds, -1: none
  std::fill(tag.begin(), tag.begin() + R, int64_t(-1));
  std::array<const float*, 64> rows{};
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t n = row / a.OH, oh = row % a.OH;
    for (int64_t kh = 0; kh < a.KH; ++kh) {
      const int64_t ih = oh * a.sh - a.ph + kh * a.dh;
      if (ih < 0 || ih >= a.H) {
        rows[kh] = zero_row;
        continue;
      }
      const int64_t slot = ih % R;
      float* buf = scratch + slot * row_floats;
      if (tag[slot] != n * a.H + ih) {
        convert_row(a, n, ih, buf);
        tag[slot] = n * a.H + ih;
      }
      rows[kh] = buf;
    }
    const int64_t m_row = row * a.OW;
    for (int64_t c0 = 0; c0 < a.C; c0 += 64) {
      const int64_t nv = std::min<int64_t>(4, (a.C - c0 + 15) / 16);
      int64_t ow = 0;
      for (; ow + kPixels <= a.OW; ow += kPixels) block_nv<kPixels>(a, rows.data(), m_row + ow, ow, c0, nv);
      for (; ow < a.OW; ++ow) block_nv<1>(a, rows.data(), m_row + ow, ow, c0, nv);
    }
  }
}

}  // namespace qbackend::kernels
