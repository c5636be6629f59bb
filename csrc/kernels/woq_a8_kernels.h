// Weights against int8 activations for decoding and prompts (no torch headers): 4-bit (W4A8) and
// 8-bit (W8A8) weights; one table of function pointers per ISA.
//
// The activations come quantized by blocks of 32 consecutive k (BlockQuantizedRows, made by the op in
// csrc/ops/woq_ops.cpp): xq[m][k] = round(x / d) with d = max |x| / 127 over the block, so that
//
//   gemv_u4a8(q, M, w, K, G, n0, n1, scale, offset, bias, y, ldy):
//       for m < M and n0 <= n < n1:
//         y[m * ldy + n] = sum_l S(n, 8 l / G) * q.lane_scale[m][l] * sum_{k = 8l}^{8l+7} u(n, k) xq[m][k]
//                        + sum_g O(n, g) * q.group_sum[m][g]  (+ bias[n])
//
//   which is x @ W^T for W[n, k] = S * u + O (the int4 weights of woq_kernels.h: the same row tiles, and
//   S, O from the float16 group tiles scale and offset) with x replaced by its block-quantized values. u(n, k) in [0, 15] is the low (k even) or high
//   (k odd) nibble of byte k / 2 of row n; G (the weight group) is a power of two >= 16.
//
// The products u * xq are summed exactly in int32 over each 8 k (u8 x s8 dot products: VNNI, or
// AVX2's 16-bit pairs, which cannot saturate with u <= 15); the scaled sums are accumulated in float32
// in an order each ISA chooses, so the ISAs agree to float32 rounding, not bit for bit.
#pragma once
#include <cstdint>

#include "kernels/woq_kernels.h"  // kRowsPerPass: the same passes of up to four rows of x

namespace qbackend::kernels {

// The rows of x, quantized by blocks of 32 k. Kp = K rounded up to a multiple of 128.
struct BlockQuantizedRows {
  const int8_t* even;        // [M][ldq]: xq at k = 0, 2, 4, ... (ldq = Kp / 2; zero beyond K)
  const int8_t* odd;         // [M][ldq]: xq at k = 1, 3, 5, ...
  int64_t ldq;
  const float* lane_scale;   // [M][ldl]: the block scale d of k = 8l .. 8l + 7 (ldl = Kp / 8; zero beyond K)
  int64_t ldl;
  const float* group_sum;    // [M][ng]: sum over the weight group g of d * xq (what the group's offset multiplies)
  int64_t ng;
};

// The same block quantization in k order, for int8 weights (W8A8):
//
//   gemv_s8a8(q, M, w, K, n0, n1, scale, bias, y, ldy):
//       y[m * ldy + n] = scale[n] * sum_l q.lane_scale[m][l] * sum_{k = 4l}^{4l+3} W[n, k] xq[m][k]  (+ bias[n])
//
// for int8 weights W [N, K] in row tiles (woq_kernels.h; any value, -128 included) with one scale per
// output channel. VNNI takes w + 128 as its unsigned operand (the sign bit flipped), a block of 32 k as
// the two 16-byte chunks of a row tile's line pair, and starts each block's int32 sums at
// q.block_offset, which takes the flipped bit's 128 * sum(xq) off again; AVX2 multiplies 16-bit values
// (vpmaddwd), exact for every int8.
struct BlockQuantizedRows8 {
  const int8_t* xq;             // [M][ldq]: xq in k order (ldq = K rounded up to 64; zero beyond K)
  int64_t ldq;
  const float* lane_scale;      // [M][ldl]: the block scale d of k = 4l .. 4l + 3 (ldl = ldq / 4; zero beyond K)
  int64_t ldl;
  const int32_t* block_offset;  // [M][ldo]: for block b and l = 0..3 (index 4b + l, ldo = ldq / 8):
                                //   -128 * sum of xq over k = 32b + 4l .. + 3 and 32b + 16 + 4l .. + 3
  int64_t ldo;
};

// Quantizing one row x [K] by blocks of 32 k into that row's part of the layouts above: d = max |x| / 127
// over the block (NaN where a value of the block is not finite), xq = x / d rounded half to even (the
// current rounding mode, as std::nearbyint; 0 where d is not > 0). The caller zeroes the row's buffers
// first; entries of k >= K stay zero. Every ISA writes the same bytes and floats as the scalar one.
//   quantize_row4 (BlockQuantizedRows): even / odd [ldq], lane_scale [ldl], group_sum [ng] (accumulated
//     lane by lane in k order, G a power of two >= 16).
//   quantize_row8 (BlockQuantizedRows8): xq [ldq], lane_scale [ldl], block_offset [ldo].
using QuantizeRow4Fn = void (*)(const float* x, int64_t K, int64_t G, int8_t* even, int8_t* odd, float* lane_scale,
                                float* group_sum);
using QuantizeRow8Fn = void (*)(const float* x, int64_t K, int8_t* xq, float* lane_scale, int32_t* block_offset);

// The reference row quantizers (woq_a8_scalar.cpp).
void quantize_row4_scalar(const float* x, int64_t K, int64_t G, int8_t* even, int8_t* odd, float* lane_scale,
                          float* group_sum);
void quantize_row8_scalar(const float* x, int64_t K, int8_t* xq, float* lane_scale, int32_t* block_offset);

struct WoqA8Kernels {
  const char* name;  // "avx512_vnni", "avx2", "scalar"
  QuantizeRow4Fn quantize_row4;
  QuantizeRow8Fn quantize_row8;
  void (*gemv_u4a8)(const BlockQuantizedRows& q, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0,
                    int64_t n1, const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy);
  void (*gemv_s8a8)(const BlockQuantizedRows8& q, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
                    const float* scale, const float* bias, float* y, int64_t ldy);
};

// Each in its own translation unit (woq_a8_<isa>.cpp); call an AVX one only where qbackend::cpu::has()
// allows its level.
const WoqA8Kernels& woq_a8_kernels_avx512_vnni();
const WoqA8Kernels& woq_a8_kernels_avx2();
const WoqA8Kernels& woq_a8_kernels_scalar();

}  // namespace qbackend::kernels
