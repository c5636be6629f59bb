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

#include <string>

#include "kernels/gemm_kernels.h"
#include "ops/checks.h"

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
// Whether this CPU (and QBACKEND_ISA cap) has a native kernel: AVX512-VNNI, or AVX-VNNI.
bool available();
// The kernels for this CPU (and QBACKEND_ISA cap): AMX where the CPU and OS have AMX-INT8 and the
// AMX kernel passed its self-check, else AVX512-VNNI, else AVX-VNNI (256-bit); raises ValueError
// where there are none.
const kernels::GemmKernels& gemm_kernels();
// Tests: run every native GEMM on the named kernel ("amx", "amx_emulated", "avx512_vnni", "avx2_vnni",
// "avx2_vnni_evex"), or "" for this CPU's choice; a ValueError if the CPU cannot run it.
void set_kernel_override(const std::string& name);
// Runs g over all rows and columns, on one thread below the size where a second one pays off.
void run(const kernels::GemmArgs& g);

// The GEMM arguments the linear and conv ops share: the weight, x's zero point (int8 x is read as
// uint8 with zero point + 128), scales, bias (contiguous, or undefined), post-op and output type
// with its requantization (ldc = N). The caller sets M, a, lda, out and the residual.
kernels::GemmArgs gemm_args(const PackedView& w, at::ScalarType x_dtype, int64_t x_zero_point, double x_scale,
                            const at::Tensor& w_scales, const at::Tensor& bias, checks::PostOp op,
                            at::ScalarType output_dtype, double output_scale, int64_t output_zero_point);

}  // namespace qbackend::native
