// Weight-only int8 and int4 products for decoding and prompts (no torch headers): one table of
// function pointers per ISA.
//
//   gemv_s8(x, ldx, M, w, K, n0, n1, scale, bias, y, ldy):
//       for m < M and n0 <= n < n1:
//         y[m * ldy + n] = scale[n] * sum_k x[m * ldx + k] * float(w[n * K + k]) (+ bias[n] if bias)
//   x: float32 rows (stride ldx), w: int8 [N, K] row-major (per-output-channel scales), y: float32.
//
//   gemv_u4(x, ldx, M, w, K, G, n0, n1, scale, offset, bias, y, ldy):
//       the same with 4-bit weights in groups of G (a multiple of 16) consecutive k of a row:
//         y[m * ldy + n] = sum_k x[m * ldx + k] * (scale[n * ng + g] * u(n, k) + offset[n * ng + g]) (+ bias[n])
//       where g = k / G, ng = ceil(K / G), u(n, k) in [0, 15] the low (k even) or high (k odd) nibble of
//       byte w[n * ceil(K / 2) + k / 2]; each weight is dequantized in float32 by one fused multiply-add.
//
// The sum is accumulated in float32 in an order each ISA chooses (lanes of 16, 8 or 1 values, then
// a reduction), so results agree across ISAs to float32 rounding, not bit for bit; each weight is
// converted exactly (an int8 is an exact float). Every weight row is read once per call for up to
// four rows of x (`kRowsPerPass`), so a decode step (M = 1) streams the weights once.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

constexpr int64_t kRowsPerPass = 4;

struct WoqKernels {
  const char* name;  // "avx512", "avx2", "scalar"
  void (*gemv_s8)(const float* x, int64_t ldx, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
                  const float* scale, const float* bias, float* y, int64_t ldy);
  void (*gemv_u4)(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0,
                  int64_t n1, const float* scale, const float* offset, const float* bias, float* y, int64_t ldy);
};

// Each is defined in its own translation unit (woq_<isa>.cpp). Only call the AVX ones when
// qbackend::cpu::has() says the CPU (and the QBACKEND_ISA cap) allows them.
const WoqKernels& woq_kernels_avx512();
const WoqKernels& woq_kernels_avx2();
const WoqKernels& woq_kernels_scalar();

}  // namespace qbackend::kernels
