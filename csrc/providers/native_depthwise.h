// The native provider's depthwise convs (groups = channels, one filter per channel): the packed
// weight and the run over threads. The op entry points are native_conv2d / native_conv2d_add_
// (native_conv.cpp), which take this route when the packed weight is a depthwise one.
//
// Packed depthwise weight (uint8 tensor [KH, KW, L], like the GEMM conv weights, so that the fake
// impls know the kernel size):
//   [0, 64)                          header: "QBNDWC04", int64 C, int64 KH, int64 KW, zeros
//   [64, 64 + 4 Cp)                  int32 colsum [Cp] (each channel's sum of taps: the zero-point
//                                    correction), in the kernel's lane order (depthwise_kernels.h)
//   [64 + 4 Cp, ... + 4 KH G Cp)     int8 w4 [KH][G][Cp][4] (depthwise_kernels.h; G = ceil(KW / 4),
//                                    Cp = C rounded up to 16, 0 beyond C and KW)
//   [..., ... + 4 KH P Cp)           int32 w32 [KH][P][Cp], the AVX2 kernel's tap pairs
//                                    (depthwise_kernels.h; P = ceil(KW / 2))
#pragma once
#include <ATen/core/Tensor.h>

#include "kernels/depthwise_kernels.h"
#include "common/conv_params.h"

namespace qbackend::native {

struct DepthwiseView {
  int64_t C = 0, KH = 0, KW = 0;
  const int32_t* colsum = nullptr;
  const int8_t* w = nullptr;
  const int32_t* w32 = nullptr;
};

// Whether `weight` [OC, IC/groups, KH, KW] with `groups` is a conv this route runs (groups = IC =
// OC); the reason it is not, or "".
std::string depthwise_refusal(const at::Tensor& weight, int64_t groups);
at::Tensor pack_depthwise(const at::Tensor& weight);
// Whether `packed` carries the depthwise header (then unpack_depthwise validates the rest).
bool is_depthwise(const at::Tensor& packed);
DepthwiseView unpack_depthwise(const at::Tensor& packed, const char* name);
// The depthwise kernel this process runs: the AVX512-VNNI one, or the AVX2 one where this CPU (or
// QBACKEND_ISA) lacks AVX512-VNNI or a test chose the native "avx2" GEMM kernel
// (set_kernel_override). The one choice, for the depthwise op and the fused inverted-residual block.
struct DepthwiseKernel {
  void (*rows)(const kernels::DepthwiseArgs&, int64_t row_begin, int64_t row_end, uint8_t* scratch);
  size_t (*scratch_bytes)(const kernels::DepthwiseArgs&);
};
// Raises ValueError without AVX2.
const DepthwiseKernel& depthwise_kernel();
// Sets the packed weight's pointers and the epilogue's column count in `a` for the kernel.
void bind_depthwise(kernels::DepthwiseArgs& a, const DepthwiseView& w);
// Runs the conv over every output row (threads split the rows) on depthwise_kernel(); a.epi's
// output, residual and requantization are set by the caller, the rest here.
void run_depthwise(kernels::DepthwiseArgs& a, const DepthwiseView& w);

}  // namespace qbackend::native
