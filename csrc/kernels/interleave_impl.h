// interleave_u8 (quantize_kernels.h) on 16-byte shuffles: C = 3 and C = 4 pixels 16 at a time,
// other channel counts and the last W % 16 pixels by the portable loop. Included by the AVX2 and
// AVX-512 quantize units after their QB_TARGET (both levels have SSSE3's pshufb).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/quantize_kernels.h"

namespace qbackend::kernels {
namespace {

// pshufb masks for C = 3: output block j (bytes 16j .. 16j + 15 of 48) takes byte p from plane
// (16j + p) % 3, pixel (16j + p) / 3; -128 (high bit set) gives 0 for the other planes' bytes.
struct Interleave3Masks {
  alignas(16) int8_t m[3][3][16];  // [output block][plane][byte]
  constexpr Interleave3Masks() : m{} {
    for (int j = 0; j < 3; ++j)
      for (int c = 0; c < 3; ++c)
        for (int p = 0; p < 16; ++p) {
          const int pos = 16 * j + p;
          m[j][c][p] = pos % 3 == c ? static_cast<int8_t>(pos / 3 - 5 * j) : int8_t(-128);
        }
  }
};

inline void interleave_u8_sse(const uint8_t* src, int64_t stride, int64_t C, int64_t W, uint8_t* dst) {
  int64_t w = 0;
  if (C == 3) {
    static constexpr Interleave3Masks k{};
    for (; w + 16 <= W; w += 16) {
      __m128i v[3];
      for (int c = 0; c < 3; ++c) v[c] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c * stride + w));
      for (int j = 0; j < 3; ++j) {
        // block j holds pixels 16j/3 .. (16j+15)/3: shift each plane so that pixel 5j is byte 0
        __m128i o = _mm_setzero_si128();
        for (int c = 0; c < 3; ++c) {
          const __m128i plane = j == 0 ? v[c] : j == 1 ? _mm_srli_si128(v[c], 5) : _mm_srli_si128(v[c], 10);
          o = _mm_or_si128(o, _mm_shuffle_epi8(plane, _mm_load_si128(reinterpret_cast<const __m128i*>(k.m[j][c]))));
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + w * 3 + 16 * j), o);
      }
    }
  } else if (C == 4) {
    for (; w + 16 <= W; w += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + w));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + stride + w));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * stride + w));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * stride + w));
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
      __m128i* out = reinterpret_cast<__m128i*>(dst + w * 4);
      _mm_storeu_si128(out + 0, _mm_unpacklo_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));
      _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
  }
  interleave_u8_from(src, stride, C, W, dst, w);
}

}  // namespace
}  // namespace qbackend::kernels
