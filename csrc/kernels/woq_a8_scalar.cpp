// Portable W4A8 and W8A8 products (woq_a8_kernels.h): the int32 sum of each 8 (W4A8) or 4 (W8A8) k,
// scaled and accumulated in k order; and the reference row quantizers.
#include <algorithm>
#include <cmath>

#include "kernels/half_float.h"
#include "kernels/woq_a8_kernels.h"

namespace qbackend::kernels {
namespace {

constexpr int64_t kBlock = 32;  // the activations' quantization block

// A block's scale d = max |x| / 127 over x[k0, k1), NaN where a value is not finite.
float block_scale(const float* x, int64_t k0, int64_t k1) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t k = k0; k < k1; ++k) {
    finite = finite && std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  return finite ? amax / 127.0f : NAN;
}

// x / d rounded half to even (0 where d is 0 or NaN).
int8_t quantized(float x, float d) { return d > 0.0f ? int8_t(std::nearbyint(x / d)) : int8_t(0); }

void gemv_u4a8(const BlockQuantizedRows& q, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
               const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ldw = (K + 1) / 2, lanes = (K + 7) / 8, tile_bytes = WeightTiles::tile_bytes(ldw);
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xe = q.even + m * q.ldq;
    const int8_t* xo = q.odd + m * q.ldq;
    const float* d = q.lane_scale + m * q.ldl;
    const float* gs = q.group_sum + m * q.ng;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* tile = w + n / 4 * tile_bytes;
      float acc = 0.0f;
      for (int64_t l = 0; l < lanes; ++l) {
        int32_t sum = 0;
        for (int64_t b = 4 * l; b < 4 * l + 4 && b < ldw; ++b) {
          const uint8_t wb = *WeightTiles::at(tile, n % 4, b);
          sum += (wb & 15) * xe[b] + (wb >> 4) * xo[b];
        }
        acc += float(sum) * (half_to_float(scale[WeightTiles::group_at(n, 8 * l / G, q.ng)]) * d[l]);
      }
      for (int64_t g = 0; g < q.ng; ++g) acc += half_to_float(offset[WeightTiles::group_at(n, g, q.ng)]) * gs[g];
      y[m * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

void gemv_s8a8(const BlockQuantizedRows8& q, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xq = q.xq + m * q.ldq;
    const float* d = q.lane_scale + m * q.ldl;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* tile = w + n / 4 * WeightTiles::tile_bytes(K);
      float acc = 0.0f;
      for (int64_t l = 0; 4 * l < K; ++l) {
        int32_t sum = 0;
        for (int64_t k = 4 * l; k < 4 * l + 4 && k < K; ++k) sum += int32_t(*WeightTiles::at(tile, n % 4, k)) * xq[k];
        acc += float(sum) * d[l];
      }
      y[m * ldy + n] = acc * scale[n] + (bias ? bias[n] : 0.0f);
    }
  }
}

constexpr WoqA8Kernels kTable{"scalar", &quantize_row4_scalar, &quantize_row8_scalar, &gemv_u4a8, &gemv_s8a8};

}  // namespace

void quantize_row4_scalar(const float* x, int64_t K, int64_t G, int8_t* even, int8_t* odd, float* lane_scale,
                          float* group_sum) {
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = std::min(K, k0 + kBlock);
    const float d = block_scale(x, k0, k1);
    for (int64_t l = k0 / 8; l * 8 < k1; ++l) {
      int32_t sum = 0;
      for (int64_t k = l * 8; k < std::min(k1, l * 8 + 8); ++k) {
        const int8_t q = quantized(x[k], d);
        (k % 2 ? odd : even)[k / 2] = q;
        sum += q;
      }
      lane_scale[l] = d;
      group_sum[l * 8 / G] += d * float(sum);
    }
  }
}

void quantize_row8_scalar(const float* x, int64_t K, int8_t* xq, float* lane_scale, int32_t* block_offset) {
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = std::min(K, k0 + kBlock);
    const float d = block_scale(x, k0, k1);
    for (int64_t k = k0; k < k1; ++k) {
      xq[k] = quantized(x[k], d);
      block_offset[k / 32 * 4 + k % 16 / 4] -= 128 * xq[k];
    }
    for (int64_t l = k0 / 4; l * 4 < k1; ++l) lane_scale[l] = d;
  }
}

const WoqA8Kernels& woq_a8_kernels_scalar() { return kTable; }

}  // namespace qbackend::kernels
