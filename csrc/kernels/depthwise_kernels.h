// qbackend's own depthwise int8 conv (the native provider's depthwise route): channels-last u8/s8
// activations, one int8 filter per channel (groups = channels, multiplier 1), any kernel, stride,
// padding and dilation, and the native GEMM's fused epilogue (gemm_kernels.h: per-channel scale,
// bias, residual, relu/gelu, u8/s8/fp32/bf16 output). No torch headers: csrc/providers/native_depthwise.cpp
// validates the arguments and calls these kernels.
//
// Arithmetic: sum_{kh,kw} (x - x_zp) * w[c][kh][kw] is computed in fp32 from integers: every
// product is at most 255 * 128 in magnitude and a kernel of at most 512 taps keeps every partial
// sum below 2^24, so the fp32 sums are the exact integer sums (then handed to the epilogue as int32).
// Input rows are converted once to fp32 (x - x_zp, zero in the padding) into a small ring of rows
// per thread, and each output row is KH x KW fused multiply-adds per 16 channels.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {

constexpr int64_t kDepthwiseMaxTaps = 512;  // KH * KW: the fp32 sums stay exact below 2^24

inline int64_t depthwise_cp(int64_t C) { return (C + 15) / 16 * 16; }  // channels padded to vectors

struct DepthwiseArgs {
  const uint8_t* x = nullptr;  // [N, H, W, C] bytes (u8, or s8 when x_int8)
  bool x_int8 = false;
  int32_t x_zp = 0;            // in x's own dtype
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0, KH = 0, KW = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  const float* w = nullptr;    // [KH * KW][depthwise_cp(C)] fp32 (0 in the padded channels)
  // The epilogue's arguments, one GEMM "row" per output pixel ((n * OH + oh) * OW + ow) and one
  // "column" per channel: N = C, ldc = C, colsum = depthwise_cp(C) zeros, a_zp = 0, a/b unused.
  GemmArgs epi;
};

// fp32 scratch one thread needs (its ring of converted input rows).
size_t depthwise_scratch_floats(const DepthwiseArgs& a);
// Computes output rows [row_begin, row_end) (row = n * OH + oh); call only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512Vnni) (the epilogue is the AVX512-VNNI kernel's).
void depthwise_rows_avx512(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, float* scratch);

}  // namespace qbackend::kernels
