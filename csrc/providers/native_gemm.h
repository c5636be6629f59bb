// The native provider's shared plumbing (csrc/providers/native_linear.cpp, native_conv.cpp): its packed
// weight as a plain uint8 tensor, the kernel choice for this CPU, and the split over threads.
//
// Packed weight tensor (uint8), made by native_linear_prepack (1-D) / native_conv2d_prepack (3-D):
//   [0, 64)                   header: "QBNGEMM1", int64 N, int64 K, int64 KH, int64 KW, zeros
//                             (KH = KW = 0 for a Linear weight)
//   [64, 64 + 4 Np)           colsum, int32 [Np]
//   [64 + 4 Np, ... + Np Kp)  panels (csrc/kernels/gemm_kernels.h)
// A conv weight [OC, C, KH, KW] is the GEMM weight [OC, KH * KW * C] (k = (kh * KW + kw) * C + c,
// the order of the gathered taps), and its tensor is shaped [KH, KW, L] over the same bytes (padded
// to a multiple of KH * KW), so that the fake impls know the kernel size. Earlier 1x1 conv weights
// were 1-D and still load. A plain tensor, not an opaque handle: it survives clone / deepcopy /
// torch.save, and every op checks its header and size before reading it.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "kernels/gemm_kernels.h"
#include "common/checks.h"

namespace qbackend::native {

struct PackedView {
  int64_t N = 0, K = 0;
  int64_t KH = 1, KW = 1;  // a conv weight's kernel size (1 x 1 for Linear weights)
  const int32_t* colsum = nullptr;
  const int8_t* panels = nullptr;
};

constexpr int64_t kHeaderBytes = 64;
int64_t packed_bytes(int64_t N, int64_t K);
// Packs w [N, K] (int8, contiguous) into a new 1-D packed tensor.
at::Tensor pack(const at::Tensor& w2d);
// Packs a conv weight [OC, C, KH, KW] (int8, groups 1) into a new [KH, KW, L] packed tensor.
at::Tensor pack_conv(const at::Tensor& weight);
// Validates `packed` (dtype, contiguity, header, size) and returns its view; `name` is the argument.
PackedView unpack(const at::Tensor& packed, const char* name);
// The same for a conv weight (3-D, or the 1-D 1x1 weights of earlier versions).
PackedView unpack_conv(const at::Tensor& packed, const char* name);
// Whether this CPU (and QBACKEND_ISA cap) has a native kernel: AVX2 and up.
bool available();
// The kernels for this CPU (and QBACKEND_ISA cap): AMX where the CPU and OS have AMX-INT8 and the
// AMX kernel passed its self-check, else AVX512-VNNI, else AVX-VNNI (256-bit), else AVX2 (int16
// products, exact); raises ValueError where there are none.
const kernels::GemmKernels& gemm_kernels();
// Tests: run every native GEMM on the named kernel ("amx", "amx_emulated", "avx512_vnni", "avx2_vnni",
// "avx2_vnni_evex", "avx2"), or "" for this CPU's choice; a ValueError if the CPU cannot run it.
void set_kernel_override(const std::string& name);
// Whether KxK convs of stride 1 or 2 over a multiple of 64 channels run on the kernel's direct convolution
// (kernels::DirectConvArgs; the AMX kernels have one) or on gathered taps like every other conv:
// on by default; tests and benchmarks switch it to compare the two (native_conv.cpp).
void set_direct_conv(bool enabled);
bool direct_conv_enabled();
// How many conv calls ran on the direct convolution in this process (tests check the route taken).
int64_t direct_conv_calls();
// Runs g over all rows and columns, on one thread below the size where a second one pays off.
void run(const kernels::GemmArgs& g);

// The GEMM arguments the linear and conv ops share: the weight, x's zero point (int8 x is read as
// uint8 with zero point + 128), scales, bias (contiguous, or undefined), post-op and output type
// with its requantization (ldc = N). The caller sets M, a, lda, out and the residual.
kernels::GemmArgs gemm_args(const PackedView& w, at::ScalarType x_dtype, int64_t x_zero_point, double x_scale,
                            const at::Tensor& w_scales, const at::Tensor& bias, checks::PostOp op,
                            at::ScalarType output_dtype, double output_scale, int64_t output_zero_point);

}  // namespace qbackend::native
