// Conversions shared by the providers' epilogues (see epilogue.h).
#include "common/epilogue.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty_like.h>

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#include "common/checks.h"
#include "runtime/parallel.h"

namespace qbackend {
namespace {

void xor80(const uint8_t* src, uint8_t* dst, int64_t n) {
  parallel::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = src[i] ^ 0x80;  // auto-vectorised
  });
}

}  // namespace

at::Tensor shift_int8_to_uint8(const at::Tensor& x) {
  TORCH_INTERNAL_ASSERT(x.is_non_overlapping_and_dense());
  at::Tensor u = at::empty_like(x, x.options().dtype(at::kByte));  // same layout (e.g. channels-last)
  xor80(reinterpret_cast<const uint8_t*>(x.const_data_ptr<int8_t>()), u.data_ptr<uint8_t>(), x.numel());
  return u;
}

at::Tensor shift_uint8_to_int8_(at::Tensor& y) {
  TORCH_INTERNAL_ASSERT(y.is_non_overlapping_and_dense());
  xor80(y.data_ptr<uint8_t>(), y.data_ptr<uint8_t>(), y.numel());
  return y.view(at::kChar);
}

at::Tensor quantize_u8(const at::Tensor& x, double scale, int64_t zero_point) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qbackend::quantize_per_tensor", "")
                       .typed<at::Tensor(const at::Tensor&, double, int64_t, at::ScalarType,
                                               std::optional<at::MemoryFormat>)>();
  return op.call(x, scale, zero_point, at::kByte, std::nullopt);
}

at::Tensor finish_from_float(const at::Tensor& y, double scale, int64_t zero_point, at::ScalarType dtype) {
  if (dtype == at::kFloat) return y;
  if (dtype == at::kBFloat16) return y.to(at::kBFloat16);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qbackend::quantize_per_tensor", "")
                       .typed<at::Tensor(const at::Tensor&, double, int64_t, at::ScalarType,
                                               std::optional<at::MemoryFormat>)>();
  return op.call(y, scale, zero_point, dtype, std::nullopt);
}

DynamicQParams choose_dynamic_qparams(const at::Tensor& x, bool reduce_range, const char* name) {
  const auto [mn, mx] = at::aminmax(x);
  const float lo_f = mn.item<float>(), hi_f = mx.item<float>();
  TORCH_CHECK_VALUE(std::isfinite(lo_f) && std::isfinite(hi_f), name,
                    " contains NaN or inf; a dynamic int8 linear cannot quantize it");
  const int qmax = reduce_range ? 127 : 255;
  const double lo = std::min<double>(lo_f, 0.0), hi = std::max<double>(hi_f, 0.0);
  float scale = hi > lo ? static_cast<float>((hi - lo) / qmax) : 1.0f;
  if (!(scale > 0.0f) || !std::isfinite(1.0 / scale)) scale = 1.0f;
  double zp = std::nearbyint(-lo / static_cast<double>(scale));
  zp = std::min<double>(std::max<double>(zp, 0.0), qmax);
  return {scale, static_cast<int32_t>(zp)};
}

}  // namespace qbackend
