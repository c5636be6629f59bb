// Global average pooling's channel sums per ISA: the exact int32 sum of each channel over the
// pixels of one channels-last image. No torch headers: csrc/ops/pool_ops.cpp validates the
// arguments, picks the unit by cpu::has and requantizes the sums.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

// sums[c] = sum over p < HW of x[p * C + c] (x: uint8, or int8 bytes when x_int8), for C channels;
// HW * 255 must fit int32 (the op takes HW <= 65536). Call only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
void channel_sums_avx2(const uint8_t* x, int64_t HW, int64_t C, bool x_int8, int32_t* sums);

}  // namespace qbackend::kernels
