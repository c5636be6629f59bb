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
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/epilogue.h"
#include "providers/native_gemm.h"
#include "runtime/activation_cache.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

using kernels::GemmArgs;

at::Tensor native_linear_prepack(const at::Tensor& weight) {
  checks::dtype(weight, at::kChar, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-D [out_features, in_features], got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.numel() > 0, "weight must not be empty, got shape ", weight.sizes());
  return native::pack(weight.contiguous());
}

struct Common {
  native::PackedView w;
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

// y [M, N] of x2 (rows with unit stride, x_dtype / x_zero_point as the caller's x).
at::Tensor run_linear(const Common& c, const at::Tensor& x2, at::ScalarType x_dtype, int64_t x_zero_point,
                      double x_scale, checks::PostOp op, at::ScalarType output_dtype, double output_scale,
                      int64_t output_zero_point) {
  at::Tensor y = runtime::empty_output({c.M, c.w.N}, at::TensorOptions().dtype(output_dtype));
  GemmArgs g = native::gemm_args(c.w, x_dtype, x_zero_point, x_scale, c.ws, c.bias, op, output_dtype, output_scale,
                                 output_zero_point);
  g.M = c.M;
  g.a = static_cast<const uint8_t*>(x2.const_data_ptr());
  g.lda = c.M > 1 ? x2.stride(0) : c.w.K;
  g.out = y.data_ptr();
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
  return run_linear(c, rows_of(x, c.M, c.w.K), x.scalar_type(), x_zero_point, x_scale, op, output_dtype,
                    output_scale, output_zero_point)
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
  return run_linear(c, xq, at::kByte, qp.zero_point, qp.scale, op, at::kFloat, 1.0, 0).view(c.shape);
}

}  // namespace

// The schemas: providers/registrations.cpp.
void register_native_linear(torch::Library& m) {
  impl_each(m, "native_linear_prepack", &native_linear_prepack,
            "native_linear", &native_linear,
            "native_linear_dynamic", &native_linear_dynamic);
}

}  // namespace qbackend
