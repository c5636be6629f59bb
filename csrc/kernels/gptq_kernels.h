// GPTQ's column loop inside one block of columns (qbackend/algorithms/gptq.py; the op around it,
// with the updates between blocks, is csrc/ops/gptq_ops.cpp): one table per ISA.
//
// Contract, for every ISA. Rows [r0, r1) of the weight, columns [c0, c0 + b) of one block, the
// LAST column first: w and q point at column c0 of row 0 (row stride ld), acc likewise (the sums
// the earlier blocks left for these columns; read, never written), l at l[c0][c0] of the lower
// triangular factor (row stride ldl), scales at row 0, d at row 0 of the block's errors (row
// stride ldd). For i = b - 1 down to 0, with a_i = acc_i plus the block's own terms so far:
//     q_i = min(max(nearbyint((w_i + a_i / l_ii) / s), qmin), qmax)
//     d_i = w_i - q_i s
//     a_j += d_i l_ij  for j < i
// each step one float32 operation as written (product, then sum: no fused multiply-add; the
// rounding mode the caller's, round to nearest even by default), so every ISA writes the same
// q and d bit for bit, and rows are independent of each other.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

// scratch: 3 x b x kGptqMaxLanes floats of the caller's (per thread).
constexpr int64_t kGptqMaxLanes = 32;

struct GptqKernels {
  const char* name;  // "avx512", "avx2", "scalar"
  void (*round_block)(const float* w, const float* acc, int64_t ld, const float* l, int64_t ldl,
                      const float* scales, float* q, float* d, int64_t ldd, int64_t b, int64_t r0, int64_t r1,
                      float qmin, float qmax, float* scratch);
};

const GptqKernels& gptq_kernels_avx512();
const GptqKernels& gptq_kernels_avx2();
const GptqKernels& gptq_kernels_scalar();

}  // namespace qbackend::kernels
