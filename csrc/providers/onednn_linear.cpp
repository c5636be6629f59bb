// The onednn provider for Linear: torch's plain-tensor oneDNN ops (onednn::qlinear_prepack /
// onednn::qlinear_pointwise), reached through the dispatcher from C++ (no Python in between).
//
// Ops (torch.ops.qbackend):
//   onednn_linear_prepack(Tensor weight, int[]? x_shape) -> Tensor      (an opaque mkldnn tensor)
//   onednn_linear(x, x_scale, x_zero_point, w_packed, w_scales, bias, output_scale,
//                 output_zero_point, output_dtype, post_op) -> Tensor
//   onednn_linear_dynamic(x, w_packed, w_scales, bias, reduce_range, post_op) -> Tensor
// oneDNN takes uint8 or int8 activations, fuses relu and (erf) gelu, and writes uint8, int8,
// fp32 or bf16 directly. Weights must be symmetric (zero points 0).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/epilogue.h"
#include "common/saturation.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

// Exactly the C++ signature torch registered (by-value tensors), or the typed handle refuses it.
using PointwiseFn = at::Tensor(at::Tensor, double, int64_t, at::Tensor, at::Tensor, at::Tensor,
                               std::optional<at::Tensor>, double, int64_t,
                               std::optional<at::ScalarType>, c10::string_view,
                               c10::List<std::optional<at::Scalar>>, c10::string_view);

const c10::TypedOperatorHandle<PointwiseFn>& pointwise_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("onednn::qlinear_pointwise", "")
                       .typed<PointwiseFn>();
  return op;
}

at::Tensor onednn_linear_prepack(const at::Tensor& weight, at::OptionalIntArrayRef x_shape) {
  checks::dtype(weight, at::kChar, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-D [out_features, in_features], got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.numel() > 0, "weight must not be empty, got shape ", weight.sizes());
  checks::int32_reduction(weight.size(1), "in_features");
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("onednn::qlinear_prepack", "")
                       .typed<at::Tensor(at::Tensor, std::optional<c10::List<int64_t>>)>();
  std::vector<int64_t> shape;
  if (x_shape.has_value()) {
    shape.assign(x_shape->begin(), x_shape->end());
    TORCH_CHECK_VALUE(!shape.empty() && shape.back() == weight.size(1),
                      "x_shape must end with in_features = ", weight.size(1), ", got ", *x_shape);
    for (int64_t d : shape)
      TORCH_CHECK_VALUE(d >= 0, "x_shape must not have negative sizes, got ", *x_shape);
  } else {
    shape = {1, weight.size(1)};
  }
  return op.call(weight.contiguous(), c10::List<int64_t>(shape));
}

// Validates the packed weight against x and returns (N, K).
std::pair<int64_t, int64_t> check_weight(const at::Tensor& x, const at::Tensor& w_packed,
                                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(w_packed.defined() && w_packed.is_mkldnn() && w_packed.scalar_type() == at::kChar &&
                        w_packed.dim() == 2,
                    "w_packed must be a oneDNN linear weight from qbackend.onednn_linear_prepack");
  // The packed oneDNN weight has the logical shape [in_features, out_features].
  const int64_t K = w_packed.size(0), N = w_packed.size(1);
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension [..., in_features], got a 0-d tensor");
  TORCH_CHECK_VALUE(x.size(-1) == K, "x's last dimension (in_features) must be ", K,
                    " to match the weight, got shape ", x.sizes());
  checks::scales(w_scales, N, "w_scales");
  checks::bias(bias, N);
  return {N, K};
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t N) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = N;
  return s;
}

at::Tensor call_pointwise(const at::Tensor& x2d, double x_scale, int64_t x_zp, const at::Tensor& w_packed,
                          const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, double out_scale,
                          int64_t out_zp, at::ScalarType out_dtype, checks::PostOp op) {
  const char* name = op == checks::PostOp::relu ? "relu" : op == checks::PostOp::gelu ? "gelu" : "none";
  const char* algo = op == checks::PostOp::gelu ? "none" : "";  // gelu "none" = exact erf form
  const at::Tensor w_zp = at::zeros({w_scales.numel()}, at::kLong);
  // Always explicit: torch reads "no dtype" as "the input's dtype", i.e. int8 for int8 activations.
  const std::optional<at::ScalarType> dt(out_dtype);
  return pointwise_op().call(x2d, x_scale, x_zp, w_packed, w_scales.contiguous(), w_zp, bias,
                             checks::is_int8_type(out_dtype) ? out_scale : 1.0,
                             checks::is_int8_type(out_dtype) ? out_zp : 0, dt, name, c10::List<std::optional<at::Scalar>>(), algo);
}

at::Tensor onednn_linear(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias,
                         double output_scale, int64_t output_zero_point, at::ScalarType output_dtype,
                         const std::string& post_op) {
  checks::activation(x, x_scale, x_zero_point);
  const auto [N, K] = check_weight(x, w_packed, w_scales, bias);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const checks::PostOp op = checks::post_op(post_op);
  const auto shape = out_shape(x, N);
  const int64_t M = x.numel() / K;
  if (M == 0) return at::empty(shape, at::TensorOptions().dtype(output_dtype));
  if (!saturation::onednn_has_vnni()) saturation::require_7bit(x, "oneDNN");
  const std::optional<at::Tensor> b =
      bias.has_value() && bias->defined() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  return call_pointwise(x.reshape({M, K}).contiguous(), x_scale, x_zero_point, w_packed, w_scales, b,
                        output_scale, output_zero_point, output_dtype, op)
      .reshape(shape);
}

at::Tensor onednn_linear_dynamic(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& w_scales,
                                 const std::optional<at::Tensor>& bias, bool reduce_range,
                                 const std::string& post_op) {
  checks::dtype(x, at::kFloat, "x");
  const auto [N, K] = check_weight(x, w_packed, w_scales, bias);
  const checks::PostOp op = checks::post_op(post_op);
  const auto shape = out_shape(x, N);
  TORCH_CHECK_VALUE(reduce_range || saturation::onednn_has_vnni(),
                    "reduce_range must be True on this CPU (or QBACKEND_ISA): without VNNI, oneDNN saturates "
                    "8-bit u8 x s8 products");
  const int64_t M = x.numel() / K;
  if (M == 0) return at::empty(shape, at::kFloat);
  const at::Tensor x2 = x.reshape({M, K}).contiguous();
  const DynamicQParams qp = choose_dynamic_qparams(x2, reduce_range, "x");
  const std::optional<at::Tensor> b =
      bias.has_value() && bias->defined() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  return call_pointwise(quantize_u8(x2, qp.scale, qp.zero_point), qp.scale, qp.zero_point, w_packed,
                        w_scales, b, 1.0, 0, at::kFloat, op)
      .reshape(shape);
}

}  // namespace

// The schemas: providers/registrations.cpp.
void register_onednn_linear(torch::Library& m) {
  impl_each(m, "onednn_linear_prepack", &onednn_linear_prepack,
            "onednn_linear", &onednn_linear,
            "onednn_linear_dynamic", &onednn_linear_dynamic);
}

}  // namespace qbackend
