// The providers' ops in the torch.ops.qbackend namespace, in one place: their schemas and the
// registration of each provider unit's kernels.
//
// "<provider>_linear", "<provider>_linear_dynamic", "<provider>_conv2d" and "<provider>_conv2d_add_"
// have one signature whatever the provider (the Python fake impls rely on it: qbackend/ops/linear.py,
// conv.py); each provider's prepack op takes what it needs. The kernels are registered on the CPU
// key and on MkldnnCPU: an mkldnn tensor argument (a oneDNN packed weight) dispatches there, and the
// same kernels then raise their ValueError / TypeError instead of the dispatcher's NotImplementedError.
#include <torch/library.h>

#include <string>

#include "providers/registrations.h"

namespace qbackend {
namespace {

constexpr const char* kLinear =
    "_linear(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, Tensor? bias, "
    "float output_scale, int output_zero_point, ScalarType output_dtype, str post_op) -> Tensor";
constexpr const char* kLinearDynamic =
    "_linear_dynamic(Tensor x, Tensor w_packed, Tensor w_scales, Tensor? bias, bool reduce_range, "
    "str post_op) -> Tensor";
constexpr const char* kConv2d =
    "_conv2d(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, Tensor? bias, "
    "int[] stride, int[] padding, int[] dilation, int groups, float output_scale, int output_zero_point, "
    "ScalarType output_dtype, str post_op, Tensor? accum=None, float accum_scale=1.0, "
    "int accum_zero_point=0) -> Tensor";
// conv2d with a residual the caller gives up: the result is written into accum.
constexpr const char* kConv2dAdd =
    "_conv2d_add_(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, Tensor? bias, "
    "int[] stride, int[] padding, int[] dilation, int groups, float output_scale, int output_zero_point, "
    "ScalarType output_dtype, str post_op, Tensor(a!) accum, float accum_scale, int accum_zero_point) -> ()";

// The native provider's fused inverted-residual block (native_inverted_residual.cpp).
constexpr const char* kInvertedResidual =
    "native_inverted_residual(Tensor x, float x_scale, int x_zero_point, Tensor? expand_w, Tensor? expand_scales, "
    "Tensor? expand_bias, float expand_scale, int expand_zero_point, ScalarType expand_dtype, str expand_post_op, "
    "Tensor dw_w, Tensor dw_scales, Tensor? dw_bias, int[] stride, int[] padding, int[] dilation, float dw_scale, "
    "int dw_zero_point, ScalarType dw_dtype, str dw_post_op, Tensor project_w, Tensor project_scales, "
    "Tensor? project_bias, float output_scale, int output_zero_point, ScalarType output_dtype, str post_op, "
    "Tensor? accum=None, float accum_scale=1.0, int accum_zero_point=0) -> Tensor";

void define(torch::Library& m, const char* provider, const char* schema) {
  m.def((std::string(provider) + schema).c_str());
}

void register_kernels(torch::Library& m) {
  register_fbgemm_linear(m);
  register_native_linear(m);
  register_onednn_linear(m);
  register_fbgemm_conv2d(m);
  register_native_conv2d(m);
  register_native_inverted_residual(m);
  register_onednn_conv2d(m);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("fbgemm_linear_prepack(Tensor weight) -> Tensor");
  m.def("native_linear_prepack(Tensor weight) -> Tensor");
  m.def("onednn_linear_prepack(Tensor weight, int[]? x_shape=None) -> Tensor");
  m.def("fbgemm_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor");
  m.def("native_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor");
  m.def(
      "onednn_conv2d_prepack(Tensor weight, Tensor w_scales, int[] stride, int[] padding, int[] dilation, "
      "int groups, int[]? x_shape=None, float x_scale=1.0, int x_zero_point=0) -> Tensor");
  for (const char* p : {"fbgemm", "native", "onednn"}) {
    define(m, p, kLinear);
    define(m, p, kLinearDynamic);
    define(m, p, kConv2d);
  }
  for (const char* p : {"native", "onednn"}) define(m, p, kConv2dAdd);
  m.def(kInvertedResidual);
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(qbackend, MkldnnCPU, m) { register_kernels(m); }

}  // namespace qbackend
