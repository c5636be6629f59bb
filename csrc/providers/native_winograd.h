// The native provider's Winograd route for 3x3 convs (native_winograd.cpp; the kernel and its
// exactness: csrc/kernels/winograd_kernels.h): stride 1, dilation 1, padding up to 2, groups 1, at
// most kernels::kWinogradMaxChannels input channels, on CPUs whose native GEMM is AVX2's (no VNNI:
// there the int16 products of the transformed tiles take 16 multiplies per 4 outputs and channel
// pair where the pair products take 36), from 16 input channels. The packing adds the Winograd filter beside the GEMM
// panels (native_gemm.h), and each call picks the route: the same output bytes either way.
#pragma once
#include <cstdint>

#include "common/conv_params.h"
#include "kernels/gemm_kernels.h"
#include "providers/native_gemm.h"

namespace qbackend::native {

// Whether native_conv2d_prepack adds the Winograd filter to a conv weight [OC, C, KH, KW] with
// these parameters (the route is on, and this CPU's GEMM is the AVX2 one).
bool winograd_packs(int64_t C, int64_t KH, int64_t KW, const Conv2dParams& p);

// The channels-last conv of x [N, H, W, C] (uint8, or int8 with x_int8; x_zp in x's own type) on
// the Winograd filter of w, with the epilogue of g (its a_zp and colsum are not used): false, and
// nothing done, where the route does not apply (no filter, parameters, an output under 12 x 12
// where the GEMM is faster, the route switched off).
bool run_winograd(const kernels::GemmArgs& g, const PackedView& w, const uint8_t* x, bool x_int8, int32_t x_zp,
                  int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, const Conv2dParams& p);

// Tests and benchmarks: switch the route (packing and calls; on by default) and count its calls.
void set_winograd(bool enabled);
bool winograd_enabled();
int64_t winograd_calls();

}  // namespace qbackend::native
