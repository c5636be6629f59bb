// Conv2d hyper-parameters as the ops receive them (int[] lists), checked once, shared by providers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorOperators.h>

#include <array>

#include "common/checks.h"

namespace qbackend {

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;

  // Output spatial size for an input of H x W and a KH x KW kernel: 0 along a dimension where the
  // dilated kernel is larger than the padded input (check_conv_hw rejects that for the conv ops).
  std::array<int64_t, 2> out_hw(int64_t H, int64_t W, int64_t KH, int64_t KW) const {
    return {out_size(H, KH, 0), out_size(W, KW, 1)};
  }

 private:
  int64_t out_size(int64_t size, int64_t k, int d) const {
    const int64_t span = size + 2 * padding[d] - dilation[d] * (k - 1) - 1;  // C++ division truncates
    return span < 0 ? 0 : span / stride[d] + 1;
  }
};

inline std::array<int64_t, 2> pair_arg(at::IntArrayRef v, const char* name, int64_t min_value) {
  TORCH_CHECK_VALUE(v.size() == 1 || v.size() == 2, name, " must have 1 or 2 values, got ", v);
  std::array<int64_t, 2> r{v[0], v.size() == 2 ? v[1] : v[0]};
  for (int64_t x : r)
    TORCH_CHECK_VALUE(x >= min_value && x < (1 << 16), name, " values must be in [", min_value,
                      ", 65535], got ", v);
  return r;
}

inline Conv2dParams conv2d_params(at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                  int64_t groups) {
  Conv2dParams p;
  p.stride = pair_arg(stride, "stride", 1);
  p.padding = pair_arg(padding, "padding", 0);
  p.dilation = pair_arg(dilation, "dilation", 1);
  TORCH_CHECK_VALUE(groups >= 1, "groups must be >= 1, got ", groups);
  p.groups = groups;
  return p;
}

// Checks a conv weight [OC, IC/groups, KH, KW] int8 against groups.
inline void check_conv_weight(const at::Tensor& weight, int64_t groups) {
  TORCH_CHECK_TYPE(weight.defined() && weight.scalar_type() == at::kChar, "weight must have dtype torch.int8, got ",
                   weight.defined() ? checks::dtype_name(weight.scalar_type()) : std::string("None"));
  TORCH_CHECK_VALUE(weight.device().is_cpu(), "weight must be a CPU tensor");
  TORCH_CHECK_TYPE(weight.layout() == at::kStrided, "weight must be a dense (strided) tensor, got layout ",
                   weight.layout());
  TORCH_CHECK_VALUE(weight.dim() == 4, "weight must be 4-D [out_channels, in_channels/groups, kH, kW], got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.numel() > 0, "weight must not be empty, got shape ", weight.sizes());
  checks::int32_reduction(weight.size(1) * weight.size(2) * weight.size(3), "in_channels/groups x kH x kW");
  TORCH_CHECK_VALUE(weight.size(0) % groups == 0, "out_channels (", weight.size(0),
                    ") must be divisible by groups (", groups, ")");
}

// Checks that an H x W input (`name`) is non-empty and, padded, covers the dilated KH x KW kernel;
// returns the output spatial size (>= 1 x 1).
inline std::array<int64_t, 2> check_conv_hw(int64_t H, int64_t W, int64_t KH, int64_t KW, const Conv2dParams& p,
                                           const char* name) {
  TORCH_CHECK_VALUE(H > 0 && W > 0, name, "'s spatial size must be non-empty (only the batch may be empty), got ",
                    H, "x", W);
  const int64_t ph = H + 2 * p.padding[0], pw = W + 2 * p.padding[1];
  const int64_t kh = p.dilation[0] * (KH - 1) + 1, kw = p.dilation[1] * (KW - 1) + 1;
  TORCH_CHECK_VALUE(ph >= kh && pw >= kw, name, "'s spatial size ", H, "x", W, " (", ph, "x", pw,
                    " with padding) is too small for a ", KH, "x", KW, " kernel (", kh, "x", kw,
                    " with dilation): kernel larger than the padded input");
  return p.out_hw(H, W, KH, KW);
}

// Checks the activation x [N, C, H, W] against the weight; returns the output spatial size.
inline std::array<int64_t, 2> check_conv_input(const at::Tensor& x, int64_t in_channels, int64_t KH, int64_t KW,
                                              const Conv2dParams& p) {
  TORCH_CHECK_VALUE(x.dim() == 4, "x must be 4-D [N, C, H, W] (channels-last memory preferred), got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(x.size(1) == in_channels, "x has ", x.size(1), " channels but the weight expects ",
                    in_channels, " (in_channels/groups * groups)");
  return check_conv_hw(x.size(2), x.size(3), KH, KW, p, "x");
}

// An optional residual input (sum post-op): int8/uint8 of the output's shape.
inline void check_accum(const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point,
                        at::IntArrayRef out_shape) {
  if (!accum.has_value() || !accum->defined()) return;
  checks::int8_activation(*accum, "accum");
  TORCH_CHECK_VALUE(accum->sizes() == out_shape, "accum must have the output's shape ", out_shape, ", got ",
                    accum->sizes());
  checks::scale(accum_scale, "accum_scale");
  checks::zero_point(accum_zero_point, accum->scalar_type(), "accum_zero_point");
}

// The in-place residual ops (<provider>_conv2d_add_) write the result into accum while the
// convolution still reads x, w and bias: accum must share no memory with them.
inline void check_accum_does_not_alias(const at::Tensor& accum, const at::Tensor& x, const at::Tensor& w_packed,
                                       const std::optional<at::Tensor>& bias, const char* op) {
  const auto overlaps = [&](const at::Tensor& t) {
    return t.defined() && t.layout() == at::kStrided && t.numel() > 0 && accum.numel() > 0 &&
           at::get_overlap_status(accum, t) != at::MemOverlapStatus::No;
  };
  TORCH_CHECK_VALUE(!overlaps(x), op, " writes its result into accum, which shares memory with x (the convolution's "
                    "input): pass a separate accum tensor (e.g. accum.clone())");
  TORCH_CHECK_VALUE(!overlaps(w_packed), op, ": accum shares memory with w_packed");
  TORCH_CHECK_VALUE(!(bias.has_value() && overlaps(*bias)), op, ": accum shares memory with bias");
}

// The unfused residual epilogue: y (fp32, no post-op yet) + dequantize(accum), then relu.
inline at::Tensor add_accum(const at::Tensor& y, const at::Tensor& accum, double accum_scale,
                            int64_t accum_zero_point, bool relu) {
  at::Tensor r = y + (accum.to(at::kFloat) - static_cast<float>(accum_zero_point)) *
                         static_cast<float>(accum_scale);
  return relu ? r.relu_() : r;
}

}  // namespace qbackend
