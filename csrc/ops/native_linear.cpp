// The native provider for Linear: qbackend's own int8 GEMM (csrc/kernels/gemm_*), with the
// epilogue fused (zero-point correction, per-channel scale, bias, relu/gelu, u8/s8/fp32/bf16 out).
//
// Ops (torch.ops.qbackend):
//   native_linear_prepack(Tensor weight) -> Tensor        int8 [N, K] -> packed uint8 tensor
//   native_linear(x, x_scale, x_zero_point, w_packed, w_scales, bias, output_scale,
//                 output_zero_point, output_dtype, post_op) -> Tensor
//   native_linear_dynamic(x, w_packed, w_scales, bias, reduce_range, post_op) -> Tensor
// x is read in place when its rows are contiguous (any leading shape); int8 x is read as uint8
// with its zero point + 128, inside the kernel. Nothing but the output is allocated per call.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/epilogue.h"
#include "ops/native_gemm.h"

namespace qbackend {
namespace {

using kernels::GemmArgs;
using kernels::GemmOut;
using kernels::GemmPost;

at::Tensor native_linear_prepack(const at::Tensor& weight) {
  checks::dtype(weight, at::kChar, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-D [out_features, in_features], got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.numel() > 0, "weight must not be empty, got shape ", weight.sizes());
  return native::pack(weight.contiguous());
}

GemmOut out_type(at::ScalarType t) {
  switch (t) {
    case at::kByte: return GemmOut::u8;
    case at::kChar: return GemmOut::s8;
    case at::kBFloat16: return GemmOut::bf16;
    default: return GemmOut::f32;
  }
}

GemmPost post(checks::PostOp op) {
  return op == checks::PostOp::relu ? GemmPost::relu : op == checks::PostOp::gelu ? GemmPost::gelu : GemmPost::none;
}

struct Common {
  native::PackedView w;
  at::Tensor x2;    // [M, K], rows contiguous
  at::Tensor bias;  // contiguous or undefined
  at::Tensor ws;    // contiguous
  std::vector<int64_t> shape;
  int64_t M = 0;
};

Common check_common(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& w_scales,
                    const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension [..., in_features], got a 0-d tensor");
  Common c;
  c.w = native::unpack(w_packed, "w_packed");
  TORCH_CHECK_VALUE(x.size(-1) == c.w.K, "x's last dimension (in_features) must be ", c.w.K,
                    " to match the weight, got shape ", x.sizes());
  checks::scales(w_scales, c.w.N, "w_scales");
  checks::bias(bias, c.w.N);
  c.shape.assign(x.sizes().begin(), x.sizes().end());
  c.shape.back() = c.w.N;
  c.M = x.numel() / c.w.K;
  c.ws = w_scales.contiguous();
  if (bias.has_value() && bias->defined()) c.bias = bias->contiguous();
  return c;
}

// Rows of x as a [M, K] matrix with unit stride along K (a view when x allows, else a copy).
at::Tensor rows_of(const at::Tensor& x, int64_t M, int64_t K) {
  at::Tensor x2 = x.reshape({M, K});
  return x2.stride(1) == 1 && (M <= 1 || x2.stride(0) >= K) ? x2 : x2.contiguous();
}

at::Tensor run_linear(const Common& c, const at::Tensor& x2, bool x_int8, int32_t x_zp_u8, float x_scale,
                      at::ScalarType output_dtype, double output_scale, int64_t output_zero_point, GemmPost p) {
  at::Tensor y = at::empty({c.M, c.w.N}, at::TensorOptions().dtype(output_dtype));
  GemmArgs g;
  g.M = c.M;
  g.N = c.w.N;
  g.K = c.w.K;
  g.a = static_cast<const uint8_t*>(x2.const_data_ptr());
  g.lda = c.M > 1 ? x2.stride(0) : c.w.K;
  g.a_int8 = x_int8;
  g.a_zp = x_zp_u8;
  g.b = c.w.panels;
  g.colsum = c.w.colsum;
  g.w_scales = c.ws.const_data_ptr<float>();
  g.bias = c.bias.defined() ? c.bias.const_data_ptr<float>() : nullptr;
  g.x_scale = x_scale;
  g.post = p;
  g.out_type = out_type(output_dtype);
  g.out = y.data_ptr();
  g.ldc = c.w.N;
  if (checks::is_int8_type(output_dtype)) {
    g.out_inv_scale = 1.0f / static_cast<float>(output_scale);
    g.out_zp = static_cast<int32_t>(output_zero_point);
  }
  native::run(g);
  return y;
}

at::Tensor native_linear(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, double output_scale,
                         int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op) {
  checks::activation(x, x_scale, x_zero_point);
  Common c = check_common(x, w_packed, w_scales, bias);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const checks::PostOp op = checks::post_op(post_op);
  native::gemm_kernels();  // raises on a CPU without the kernels, before anything else
  if (c.M == 0) return at::empty(c.shape, at::TensorOptions().dtype(output_dtype));
  const bool x_int8 = x.scalar_type() == at::kChar;
  const at::Tensor x2 = rows_of(x, c.M, c.w.K);
  return run_linear(c, x2, x_int8, static_cast<int32_t>(x_zero_point) + (x_int8 ? 128 : 0),
                    static_cast<float>(x_scale), output_dtype, output_scale, output_zero_point, post(op))
      .view(c.shape);
}

at::Tensor native_linear_dynamic(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& w_scales,
                                 const std::optional<at::Tensor>& bias, bool reduce_range,
                                 const std::string& post_op) {
  checks::dtype(x, at::kFloat, "x");
  Common c = check_common(x, w_packed, w_scales, bias);
  const checks::PostOp op = checks::post_op(post_op);
  native::gemm_kernels();
  if (c.M == 0) return at::empty(c.shape, at::kFloat);
  const at::Tensor x2 = x.reshape({c.M, c.w.K}).contiguous();
  const DynamicQParams qp = choose_dynamic_qparams(x2, reduce_range, "x");
  const at::Tensor xq = quantize_u8(x2, qp.scale, qp.zero_point);
  return run_linear(c, xq, false, qp.zero_point, qp.scale, at::kFloat, 1.0, 0, post(op)).view(c.shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("native_linear_prepack(Tensor weight) -> Tensor");
  m.def(
      "native_linear(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, "
      "Tensor? bias, float output_scale, int output_zero_point, ScalarType output_dtype, "
      "str post_op) -> Tensor");
  m.def(
      "native_linear_dynamic(Tensor x, Tensor w_packed, Tensor w_scales, Tensor? bias, "
      "bool reduce_range, str post_op) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("native_linear_prepack", &native_linear_prepack);
  m.impl("native_linear", &native_linear);
  m.impl("native_linear_dynamic", &native_linear_dynamic);
}
TORCH_LIBRARY_IMPL(qbackend, MkldnnCPU, m) {
  m.impl("native_linear_prepack", &native_linear_prepack);
  m.impl("native_linear", &native_linear);
  m.impl("native_linear_dynamic", &native_linear_dynamic);
}

}  // namespace qbackend
