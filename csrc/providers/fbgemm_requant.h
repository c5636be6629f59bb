// FBGEMM's ReQuantizeOutput parameters for a uint8/int8 output, shared by the fbgemm linear and
// conv ops. int8 output is computed as uint8 with zero point + 128 and shifted back (exact).
#pragma once
#include <ATen/ATen.h>

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
};

}  // namespace qbackend
