// The native provider's shared plumbing (csrc/ops/native_linear.cpp, native_conv.cpp): its packed
// weight as a plain uint8 tensor, the kernel choice for this CPU, and the split over threads.
//
// Packed weight tensor (uint8, 1-D), made by native_linear_prepack / native_conv2d_prepack:
//   [0, 64)                   header: "QBNGEMM1", int64 N, int64 K, zeros
//   [64, 64 + 4 Np)           colsum, int32 [Np]
//   [64 + 4 Np, ... + Np Kp)  panels (csrc/kernels/gemm_kernels.h)
// A plain tensor, not an opaque handle: it survives clone / deepcopy / torch.save, and every op
// checks its header and size against N and K before reading it.
#pragma once
#include <ATen/ATen.h>

#include "kernels/gemm_kernels.h"

namespace qbackend::native {

struct PackedView {
  int64_t N = 0, K = 0;
  const int32_t* colsum = nullptr;
  const int8_t* panels = nullptr;
};

constexpr int64_t kHeaderBytes = 64;
int64_t packed_bytes(int64_t N, int64_t K);
// Packs w [N, K] (int8, contiguous) into a new packed tensor.
at::Tensor pack(const at::Tensor& w2d);
// Validates `packed` (dtype, contiguity, header, size) and returns its view; `name` is the argument.
PackedView unpack(const at::Tensor& packed, const char* name);
// The kernels for this CPU (and QBACKEND_ISA cap); raises ValueError where there are none.
const kernels::GemmKernels& gemm_kernels();
// Runs g over all rows and columns, on one thread below the size where a second one pays off.
void run(const kernels::GemmArgs& g);

}  // namespace qbackend::native
