// RMSNorm for decoder LLMs (qbackend.nn.RMSNorm, swapped in by qbackend.quantize_llm):
//
//   rms_norm(x, weight, eps) -> y
//       y[..., h] = weight[h] * (x[..., h] * r), r = 1 / sqrt(mean_h(x^2) + eps), per row of H = x.size(-1);
//       x float32 [..., H], weight float32 [H], eps >= 0.
//
// The form of Llama's norm (and Mistral's, Qwen2's, ...) in float32, as one call instead of the six
// torch ops of the model's own Python (pow, mean, add, rsqrt, two products). The sum of squares runs
// in double, so y differs from the torch ops' float32 result only by their own rounding.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#include "common/checks.h"
#include "ops/rms_norm_ops.h"

namespace qbackend::ops {

using at::Tensor;

Tensor rms_norm(const Tensor& x, const Tensor& weight_in, double eps) {
  checks::dtype(x, at::kFloat, "x");
  checks::dtype(weight_in, at::kFloat, "weight");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension (its last is the normalized one)");
  const int64_t H = x.size(-1);
  TORCH_CHECK_VALUE(weight_in.dim() == 1 && weight_in.size(0) == H, "weight must be 1-D with x's last dimension ",
                    H, ", got shape ", weight_in.sizes());
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "eps must be a finite number >= 0, got ", eps);
  const Tensor xc = x.contiguous(), w = weight_in.contiguous();
  Tensor y = at::empty_like(xc);
  const int64_t rows = H ? xc.numel() / H : 0;
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * H;
      float* yr = yp + r * H;
      double ss = 0.0;
      for (int64_t h = 0; h < H; ++h) ss += double(xr[h]) * double(xr[h]);
      const float inv = float(1.0 / std::sqrt(ss / double(H) + eps));
      for (int64_t h = 0; h < H; ++h) yr[h] = wp[h] * (xr[h] * inv);
    }
  });
  return y;
}

}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("rms_norm", &qbackend::ops::rms_norm); }
