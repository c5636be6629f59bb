// Pooling loops per ISA on channels-last int8 images: global average pooling's channel sums (the
// exact int32 sum of each channel over the pixels of one image) and max pooling's window maxima.
// No torch headers: csrc/ops/pool_ops.cpp validates the arguments, picks the unit by cpu::has and
// requantizes the sums.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

// sums[c] = sum over p < HW of x[p * C + c] (x: uint8, or int8 bytes when x_int8), for C channels;
// HW * 255 must fit int32 (the op takes HW <= 65536). Call only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
void channel_sums_avx2(const uint8_t* x, int64_t HW, int64_t C, bool x_int8, int32_t* sums);

// One output row of max pooling: y[ow * C + c] = the maximum of x[(ih * W + iw) * C + c] over the
// window's rows ih in [h0, h1) (the caller clips them to the image) and, per output column ow < OW,
// columns iw = ow * stride_w - pad_w + j * dil_w (j < kw) inside [0, W); x: one channels-last
// image (uint8, or int8 bytes when x_int8). Every window has at least one column inside the image
// and h1 > h0. Call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
void max_pool_row_avx2(const uint8_t* x, uint8_t* y, int64_t C, int64_t W, int64_t OW, int64_t h0, int64_t h1,
                       int64_t dil_h, int64_t kw, int64_t stride_w, int64_t pad_w, int64_t dil_w, bool x_int8);

}  // namespace qbackend::kernels
