// qbackend::quantize_weight_rows(w, scales, qmin, qmax) -> q: the int8 levels of a float32 weight
// [N, ...] with one scale per output channel (row), q = clamp(round(w / s_n), qmin, qmax), the division
// and the rounding (to nearest, ties to even, as torch.round) in float64: what the weight quantizer
// (qbackend/nn/weights.py) computed as torch ops on an fp64 copy, in one pass with no temporary (the
// reference: qbackend/ops/reference.py quantize_weight_rows, bit for bit). q is contiguous, w's shape.
// scales: float32 [N], each positive and finite; a NaN or infinite weight is a ValueError.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "common/checks.h"

namespace qbackend::ops {
namespace {

// x rounded to the nearest integer, ties to even, for |x| <= 2^51: adding and subtracting 1.5 * 2^52
// leaves no fraction bits under the default rounding mode (round to nearest even).
inline double round_half_even(double x) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  return (x + kMagic) - kMagic;  // not folded to x: the build does not allow value-changing optimizations
}

at::Tensor quantize_weight_rows(const at::Tensor& w_in, const at::Tensor& scales_in, int64_t qmin, int64_t qmax) {
  checks::dtype(w_in, at::kFloat, "w");
  checks::dtype(scales_in, at::kFloat, "scales");
  TORCH_CHECK_VALUE(w_in.dim() >= 1, "w must have an output-channel dim, got a 0-D tensor");
  TORCH_CHECK_VALUE(-128 <= qmin && qmin <= qmax && qmax <= 127, "qmin and qmax must satisfy -128 <= qmin <= qmax "
                    "<= 127, got ", qmin, " and ", qmax);
  const int64_t n = w_in.size(0);
  TORCH_CHECK_VALUE(scales_in.numel() == n, "scales must hold one value per output channel (", n, "), got ",
                    scales_in.numel());
  const at::Tensor w = w_in.contiguous();
  const at::Tensor scales = scales_in.reshape({-1}).contiguous();
  const float* sp = scales.const_data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    TORCH_CHECK_VALUE(std::isfinite(sp[r]) && sp[r] > 0.0f, "scales must be positive and finite, got ", sp[r],
                      " for output channel ", r);
  at::Tensor q = at::empty(w.sizes(), w.options().dtype(at::kChar));
  const int64_t cols = n == 0 ? 0 : w.numel() / n;
  if (w.numel() == 0) return q;
  const float* wp = w.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  const double lo = static_cast<double>(qmin), hi = static_cast<double>(qmax);
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols));
  std::atomic<bool> nonfinite{false};
  at::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
    bool bad = false;
    for (int64_t r = r0; r < r1; ++r) {
      const double s = static_cast<double>(sp[r]);
      const float* src = wp + r * cols;
      int8_t* dst = qp + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double x = static_cast<double>(src[c]);
        bad |= !(std::fabs(x) <= 3.5e38);  // NaN or inf
        // the bounds are integers, so clamping before rounding gives round-then-clamp's level (a NaN
        // becomes lo here, and the call raises)
        double v = x / s;
        v = v > lo ? v : lo;
        v = v < hi ? v : hi;
        dst[c] = static_cast<int8_t>(static_cast<int32_t>(round_half_even(v)));
      }
    }
    if (bad) nonfinite.store(true, std::memory_order_relaxed);
  });
  TORCH_CHECK_VALUE(!nonfinite.load(), "w has NaN or inf values");
  return q;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("quantize_weight_rows(Tensor w, Tensor scales, int qmin, int qmax) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("quantize_weight_rows", &qbackend::ops::quantize_weight_rows); }
