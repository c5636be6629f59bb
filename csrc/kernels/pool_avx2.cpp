// Pooling loops (pool_kernels.h) on AVX2.
// Global average pooling's channel sums: 64 channels at a time held in int16 registers over up to
// 128 pixels (|sum| <= 128 x 255, exact), then added to the int32 sums; the channels past the last
// 16 one at a time.
// Max pooling: per output pixel, 128 channels at a time held in four registers over the window's
// pixels (vpmaxub / vpmaxsb), then 32 and 16 at a time, the last ones one at a time.
// Call only when has(Isa::Avx2).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/pool_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX2)

#include <immintrin.h>

namespace qbackend::kernels {
namespace {

constexpr int64_t kChunk = 128;  // pixels summed in int16 before widening

template <bool I8>
inline __m256i widen(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return I8 ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
}

// Adds the 16 int16 lanes of v to sums[0..16).
inline void add_to(int32_t* sums, __m256i v) {
  const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(v));
  const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1));
  __m256i* s = reinterpret_cast<__m256i*>(sums);
  _mm256_storeu_si256(s, _mm256_add_epi32(_mm256_loadu_si256(s), lo));
  _mm256_storeu_si256(s + 1, _mm256_add_epi32(_mm256_loadu_si256(s + 1), hi));
}

// Channels [c0, c0 + 16 NV) over pixels [p0, p1) (p1 - p0 <= kChunk).
template <int NV, bool I8>
void sum_block(const uint8_t* x, int64_t C, int64_t c0, int64_t p0, int64_t p1, int32_t* sums) {
  __m256i acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_si256();
  const uint8_t* p = x + p0 * C + c0;
  for (int64_t i = p0; i < p1; ++i, p += C) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_add_epi16(acc[v], widen<I8>(p + 16 * v));
  }
  for (int v = 0; v < NV; ++v) add_to(sums + c0 + 16 * v, acc[v]);
}

template <bool I8>
void sums_impl(const uint8_t* x, int64_t HW, int64_t C, int32_t* sums) {
  std::fill(sums, sums + C, 0);
  const int64_t C16 = C / 16 * 16;
  for (int64_t p0 = 0; p0 < HW; p0 += kChunk) {
    const int64_t p1 = std::min(HW, p0 + kChunk);
    int64_t c0 = 0;
    for (; c0 + 64 <= C16; c0 += 64) sum_block<4, I8>(x, C, c0, p0, p1, sums);
    for (; c0 < C16; c0 += 16) sum_block<1, I8>(x, C, c0, p0, p1, sums);
  }
  for (int64_t c = C16; c < C; ++c) {
    int32_t s = 0;
    for (int64_t i = 0; i < HW; ++i) s += I8 ? static_cast<int8_t>(x[i * C + c]) : x[i * C + c];
    sums[c] = s;
  }
}

template <bool I8>
inline __m256i max32(__m256i a, __m256i b) {
  return I8 ? _mm256_max_epi8(a, b) : _mm256_max_epu8(a, b);
}

template <bool I8>
inline __m128i max16(__m128i a, __m128i b) {
  return I8 ? _mm_max_epi8(a, b) : _mm_max_epu8(a, b);
}

// Channels [c0, c0 + 32 NV) of one output pixel over the window's pixels (offsets into x).
template <int NV, bool I8>
inline void max_block(const uint8_t* x, const int64_t* offs, int64_t n, int64_t c0, uint8_t* y) {
  __m256i acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + offs[0] + c0 + 32 * v));
  for (int64_t i = 1; i < n; ++i) {
    const uint8_t* p = x + offs[i] + c0;
    for (int v = 0; v < NV; ++v) acc[v] = max32<I8>(acc[v], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * v)));
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + c0 + 32 * v), acc[v]);
}

template <bool I8>
void max_row_impl(const uint8_t* x, uint8_t* y, int64_t C, int64_t W, int64_t OW, int64_t h0, int64_t h1,
                  int64_t dil_h, int64_t kw, int64_t sw, int64_t pw, int64_t dw) {
  const int64_t rows = (h1 - h0 + dil_h - 1) / dil_h;
  std::vector<int64_t> window(static_cast<size_t>(rows * kw));
  int64_t* offs = window.data();
  for (int64_t ow = 0; ow < OW; ++ow, y += C) {
    int64_t n = 0;  // the window's pixels inside the image, as offsets into x
    for (int64_t ih = h0; ih < h1; ih += dil_h) {
      for (int64_t j = 0; j < kw; ++j) {
        const int64_t iw = ow * sw - pw + j * dw;
        if (iw >= 0 && iw < W) offs[n++] = (ih * W + iw) * C;
      }
    }
    int64_t c0 = 0;
    for (; c0 + 128 <= C; c0 += 128) max_block<4, I8>(x, offs, n, c0, y);
    for (; c0 + 32 <= C; c0 += 32) max_block<1, I8>(x, offs, n, c0, y);
    for (; c0 + 16 <= C; c0 += 16) {
      __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + offs[0] + c0));
      for (int64_t i = 1; i < n; ++i)
        acc = max16<I8>(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + offs[i] + c0)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + c0), acc);
    }
    for (; c0 < C; ++c0) {
      if (I8) {
        int8_t m = static_cast<int8_t>(x[offs[0] + c0]);
        for (int64_t i = 1; i < n; ++i) m = std::max(m, static_cast<int8_t>(x[offs[i] + c0]));
        y[c0] = static_cast<uint8_t>(m);
      } else {
        uint8_t m = x[offs[0] + c0];
        for (int64_t i = 1; i < n; ++i) m = std::max(m, x[offs[i] + c0]);
        y[c0] = m;
      }
    }
  }
}

}  // namespace

void max_pool_row_avx2(const uint8_t* x, uint8_t* y, int64_t C, int64_t W, int64_t OW, int64_t h0, int64_t h1,
                       int64_t dil_h, int64_t kw, int64_t stride_w, int64_t pad_w, int64_t dil_w, bool x_int8) {
  if (x_int8) max_row_impl<true>(x, y, C, W, OW, h0, h1, dil_h, kw, stride_w, pad_w, dil_w);
  else max_row_impl<false>(x, y, C, W, OW, h0, h1, dil_h, kw, stride_w, pad_w, dil_w);
}

void channel_sums_avx2(const uint8_t* x, int64_t HW, int64_t C, bool x_int8, int32_t* sums) {
  if (x_int8) sums_impl<true>(x, HW, C, sums);
  else sums_impl<false>(x, HW, C, sums);
}

}  // namespace qbackend::kernels
