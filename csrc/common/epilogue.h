// Output and input conversions shared by the providers: int8 <-> uint8 shifts, fp32 -> int8/bf16
// finishing (for epilogues a library cannot fuse), and the dynamic activation qparams rule.
#pragma once
#include <ATen/core/Tensor.h>

namespace qbackend {

// x (int8, dense) + 128 as uint8 in the same layout: an exact change of zero point.
at::Tensor shift_int8_to_uint8(const at::Tensor& x);
// In place: uint8 - 128 reinterpreted as int8 (same bytes, xor 0x80); returns the int8 view.
at::Tensor shift_uint8_to_int8_(at::Tensor& y);
// y fp32: returns y (fp32), y in bf16, or quantize(y, scale, zp) as uint8/int8.
at::Tensor finish_from_float(const at::Tensor& y, double scale, int64_t zero_point, at::ScalarType dtype);
// Quantize fp32 -> uint8 with the contract's rounding (fp32 division, half-to-even).
at::Tensor quantize_u8(const at::Tensor& x, double scale, int64_t zero_point);

struct DynamicQParams {
  float scale;
  int32_t zero_point;
};
// Asymmetric uint8 over [min(x,0), max(x,0)], 7-bit when reduce_range (same rule as
// qbackend.ops.reference.choose_dynamic_qparams). Raises ValueError on NaN/inf in x.
DynamicQParams choose_dynamic_qparams(const at::Tensor& x, bool reduce_range, const char* name);

}  // namespace qbackend
