// Portable weight-only int8 and int4 products (woq_kernels.h): one float32 accumulator per output, in k
// order (each int4 weight dequantized by std::fma, one rounding, as the SIMD kernels' FMA).
#include <cmath>

#include "kernels/half_float.h"
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
        acc += xr[k] * std::fma(half_to_float(scale[g]), float(u), half_to_float(offset[g]));
      }
      y[m * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

constexpr WoqKernels kTable{"scalar", &gemv_s8, &gemv_u4};

}  // namespace

const WoqKernels& woq_kernels_scalar() { return kTable; }

}  // namespace qbackend::kernels
