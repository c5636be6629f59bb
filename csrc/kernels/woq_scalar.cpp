// Portable weight-only int8 and int4 products (woq_kernels.h): one float32 accumulator per output, in k
// order (each int4 weight dequantized by std::fma, one rounding, as the SIMD kernels' FMA).
#include <cmath>
#include <cstring>

#include "kernels/woq_kernels.h"

namespace qbackend::kernels {
namespace {

void gemv_s8(const float* x, int64_t ldx, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
             const float* scale, const float* bias, float* y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* tile = w + n / 4 * WeightTiles::tile_bytes(K);
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * float(*WeightTiles::at(tile, n % 4, k));
      y[m * ldy + n] = acc * scale[n] + (bias ? bias[n] : 0.0f);
    }
  }
}

void gemv_u4(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
             const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ng = (K + G - 1) / G, tile_bytes = WeightTiles::tile_bytes((K + 1) / 2);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* tile = w + n / 4 * tile_bytes;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t b = *WeightTiles::at(tile, n % 4, k / 2);
        const int u = (k & 1) ? (b >> 4) : (b & 15);
        const int64_t g = WeightTiles::group_at(n, k / G, ng);
        acc += xr[k] * std::fma(f16_to_float(scale[g]), float(u), f16_to_float(offset[g]));
      }
      y[m * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

constexpr WoqKernels kTable{"scalar", &gemv_s8, &gemv_u4};

}  // namespace

float f16_to_float(F16 h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // infinity, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: the exponent rebased from 15 to 127
  } else if (mant == 0) {
    bits = sign;  // zero
  } else {
    // subnormal: mant x 2^-24, normalized (a float32 holds it exactly)
    int shift = 0;
    uint32_t m = mant;
    while (!(m & 0x400u)) {
      m <<= 1;
      ++shift;
    }
    bits = sign | (uint32_t(113 - shift) << 23) | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

const WoqKernels& woq_kernels_scalar() { return kTable; }

}  // namespace qbackend::kernels
