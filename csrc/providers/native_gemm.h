// The native provider's shared plumbing (csrc/providers/native_linear.cpp, native_conv.cpp): its packed
// weight as a plain uint8 tensor, the kernel choice for this CPU, and the split over threads.
//
// Packed weight tensor (uint8), made by native_linear_prepack (1-D) / native_conv2d_prepack (3-D):
//   [0, 64)                   header: "QBNGEMM1", int64 N, int64 K, int64 KH, int64 KW, int64 Kg,
//                             int64 w7, int64 winograd (KH = KW = 0 for a Linear weight; Kg = 0 for
//                             Kg = K; w7: every weight in [-64, 64]; winograd: the filter below follows)
//   [64, 64 + 4 Np)           colsum, int32 [Np]
//   [64 + 4 Np, ... + Np Kp)  panels (csrc/kernels/gemm_kernels.h) of the GEMM weight [N, Kg]
//   then, with winograd (3x3 conv weights only), from the next multiple of 64 bytes: the Winograd
//   conv's int16 filter (csrc/kernels/winograd_kernels.h), winograd_packed_elems(N, C) of them
// Kg: the GEMM's K, the weight's K padded with zero columns where the tile kernel runs whole
// 64-k steps instead of a VNNI tail (a conv over 1-15 channels on AMX: pack_conv); the rows of
// gathered taps are then Kg bytes apart, their bytes past K multiplied by the zeros.
// A conv weight [OC, C, KH, KW] is the GEMM weight [OC, KH * KW * C] (k = (kh * KW + kw) * C + c,
// the order of the gathered taps), and its tensor is shaped [KH, KW, L] over the same bytes (padded
// to a multiple of KH * KW), so that the fake impls know the kernel size. Earlier 1x1 conv weights
// were 1-D and still load. A plain tensor, not an opaque handle: it survives clone / deepcopy /
// torch.save, and every op checks its header and size before reading it.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "kernels/gemm_kernels.h"
#include "common/checks.h"

namespace qbackend::native {

struct PackedView {
  int64_t N = 0, K = 0;
  int64_t Kg = 0;          // the GEMM's K (>= K: zero columns past K)
  int64_t KH = 1, KW = 1;  // a conv weight's kernel size (1 x 1 for Linear weights)
  bool w7 = false;         // every weight in [-64, 64]: 7 bits (the header's flag, set by the packing)
  const int32_t* colsum = nullptr;
  const int8_t* panels = nullptr;
  const int16_t* winograd = nullptr;  // a 3x3 conv's Winograd filter, where the packing added one
};

constexpr int64_t kHeaderBytes = 64;
int64_t packed_bytes(int64_t N, int64_t K);
// Packs w [N, K] (int8, contiguous) into a new 1-D packed tensor.
at::Tensor pack(const at::Tensor& w2d);
// Packs a conv weight [OC, C, KH, KW] (int8, groups 1) into a new [KH, KW, L] packed tensor; a KxK
// weight over 1-15 channels whose K is not a multiple of 64 gets Kg = K rounded up to 64 where this
// CPU's kernel is the AMX one (its tiles then cover every k). With `winograd` (a 3x3 weight over at
// most kernels::kWinogradMaxChannels channels) the tensor also holds its Winograd filter.
at::Tensor pack_conv(const at::Tensor& weight, bool winograd = false);
// The GEMM's K for a conv weight over C channels with a KH x KW kernel (pack_conv's Kg).
int64_t conv_gemm_k(int64_t C, int64_t KH, int64_t KW);
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
// The kernels for the GEMM g: gemm_kernels(), except that the AVX2 kernel hands weights of 7 bits
// (g.b_7bit) to the pair-product kernel (kernels::gemm_kernels_avx2_pairs), exact on them only and
// faster (benchmarks/results/epyc_zen3/kernels_avx2_pairs.md), unless a test chose "avx2_int16".
const kernels::GemmKernels& gemm_kernels(const kernels::GemmArgs& g);
// The kernel's name for GEMMs on the packed weight `packed` (a Linear's or a conv's): tests check the choice.
std::string kernel_for(const at::Tensor& packed);
// Tests: run every native GEMM on the named kernel ("amx", "amx_emulated", "avx512_vnni", "avx2_vnni",
// "avx2_vnni_evex", "avx2": AVX2's, pair products on 7-bit weights; "avx2_int16": AVX2's int16
// products on every weight), or "" for this CPU's choice; a ValueError if the CPU cannot run it.
void set_kernel_override(const std::string& name);
// Whether KxK convs of stride 1 or 2 over a multiple of 64 channels run on the kernel's direct convolution
// (kernels::DirectConvArgs; the AMX kernels have one) or on gathered taps like every other conv:
// on by default; tests and benchmarks switch it to compare the two (native_conv.cpp).
void set_direct_conv(bool enabled);
// How many conv calls ran on the direct convolution in this process (tests check the route taken).
int64_t direct_conv_calls();
// A buffer of at least `bytes` on this thread, 64-byte aligned, grown as needed and kept (nothing
// allocated per call): the conv routes' scratch (gathered taps, the direct conv's planes, the Winograd
// blocks). One per thread, shared by those routes: each call uses it and is done before the next.
uint8_t* conv_scratch(int64_t bytes);
// Runs g over all rows and columns, on one thread below the size where a second one pays off.
void run(const kernels::GemmArgs& g);

// The GEMM arguments the linear and conv ops share: the weight, x's zero point (int8 x is read as
// uint8 with zero point + 128), scales, bias (contiguous, or undefined), post-op and output type
// with its requantization (ldc = N). The caller sets M, a, lda, out and the residual.
kernels::GemmArgs gemm_args(const PackedView& w, at::ScalarType x_dtype, int64_t x_zero_point, double x_scale,
                            const at::Tensor& w_scales, const at::Tensor& bias, checks::PostOp op,
                            at::ScalarType output_dtype, double output_scale, int64_t output_zero_point);

}  // namespace qbackend::native
