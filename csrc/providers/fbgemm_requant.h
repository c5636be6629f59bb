// FBGEMM's ReQuantizeOutput parameters for a uint8/int8 output, shared by the fbgemm linear and
// conv ops. int8 output is computed as uint8 with zero point + 128 and shifted back (exact).
#pragma once
#include <ATen/core/Tensor.h>

#include <cmath>
#include <vector>

namespace qbackend {

struct FbgemmRequant {
  std::vector<float> act_times_w;  // x_scale * w_scale[n]: FBGEMM divides a float bias by it
  std::vector<float> multiplier;   // act_times_w[n] / output_scale
  int32_t zero_point;              // output zero point, + 128 for int8 output

  FbgemmRequant(double x_scale, const at::Tensor& w_scales, double output_scale, int64_t output_zero_point,
                at::ScalarType output_dtype)
      : act_times_w(w_scales.numel()), multiplier(w_scales.numel()),
        zero_point(static_cast<int32_t>(output_zero_point) + (output_dtype == at::kChar ? 128 : 0)) {
    const float xs = static_cast<float>(x_scale), os = static_cast<float>(output_scale);
    const float* ws = w_scales.const_data_ptr<float>();
    for (size_t n = 0; n < act_times_w.size(); ++n) {
      act_times_w[n] = xs * ws[n];
      multiplier[n] = act_times_w[n] / os;
    }
  }

  // Whether FBGEMM's float requantization stays inside int32 for every accumulator a reduction of
  // length K can give (|x - zp| <= 255, |w| <= 128) plus the bias: float(acc) * multiplier is
  // converted to int32 before clamping, and a product past int32 comes back as INT32_MIN (0 after
  // clamping where 255 is right). Callers take their exact float route where it does not fit.
  bool fits(int64_t K, const float* bias) const {
    const double acc_max = static_cast<double>(K) * 255.0 * 128.0;
    for (size_t n = 0; n < multiplier.size(); ++n) {
      const double b = bias == nullptr ? 0.0 : std::abs(static_cast<double>(bias[n]));
      const double q = (acc_max + (act_times_w[n] > 0 ? b / act_times_w[n] : 0.0)) * multiplier[n];
      if (!(q + std::abs(static_cast<double>(zero_point)) < 2.0e9)) return false;
    }
    return true;
  }
};

}  // namespace qbackend
