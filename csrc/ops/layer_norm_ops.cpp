// torch op qbackend::layer_norm_quantize: (residual add +) LayerNorm over the last dimension, with
// the quantize of its output fused, for the LayerNorms of transformer blocks whose output is both
// a float value (the next residual) and the int8 input of the next Linears.
//
//   layer_norm_quantize(x [..., C], residual?, weight? [C], bias? [C], eps, scales [C], zero_point,
//                       dtype, qmax) -> (y float32 [..., C], q uint8/int8 [..., C])
//
// y = layer_norm(x + residual) (aten's semantics, fp32 statistics; the residual has x's shape or
// broadcasts to it over leading dimensions, as BERT's position embeddings [1, S, C] do over the
// batch); q quantizes y per channel of
// the last dimension exactly as qbackend::quantize_per_channel does (scales: per-tensor scale
// times SmoothQuant's divisors, or all equal), then saturates at qmax (7-bit activations).
// Inputs of any strides (made contiguous); float32 only. AVX512 kernel
// (csrc/kernels/layer_norm_avx512.cpp) when qbackend::cpu::has(qbackend::cpu::Isa::Avx512), else ATen ops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/round.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "cpu/probe.h"
#include "kernels/layer_norm_kernels.h"
#include "common/checks.h"
#include "runtime/parallel.h"

namespace qbackend::ops {
namespace {

constexpr int64_t kGrain = 32768;  // elements per parallel task

// r broadcasts to x by repeating along x's leading dimensions: r has at most x's dimensions and,
// without its leading 1s, is a suffix of x's shape. Its rows then repeat every numel(r) / C rows of x.
bool broadcasts_over_leading_dims(at::IntArrayRef r, at::IntArrayRef x) {
  if (r.size() > x.size()) return false;  // x + r would have more dimensions than x
  size_t lead = 0;
  while (lead < r.size() && r[lead] == 1 && r.size() - lead > 1) ++lead;
  const size_t n = r.size() - lead;
  for (size_t i = 0; i < n; ++i)
    if (r[lead + i] != x[x.size() - n + i]) return false;
  return true;
}

void check_vector(const std::optional<at::Tensor>& t, int64_t C, const char* name) {
  if (!t.has_value() || !t->defined()) return;
  checks::dtype(*t, at::kFloat, name);
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == C, name, " must be 1-D with ", C,
                    " elements (the last dimension of x), got shape ", t->sizes());
}

std::tuple<at::Tensor, at::Tensor> layer_norm_quantize(const at::Tensor& x_in, const std::optional<at::Tensor>& res_in,
                                                       const std::optional<at::Tensor>& w_in,
                                                       const std::optional<at::Tensor>& b_in, double eps,
                                                       const at::Tensor& scales_in, int64_t zero_point,
                                                       at::ScalarType dtype, int64_t qmax) {
  checks::dtype(x_in, at::kFloat, "x");
  TORCH_CHECK_VALUE(x_in.dim() >= 1 && x_in.size(-1) > 0, "x must have a non-empty last dimension, got shape ",
                    x_in.sizes());
  const int64_t C = x_in.size(-1);
  const bool has_res = res_in.has_value() && res_in->defined();
  if (has_res) {
    checks::dtype(*res_in, at::kFloat, "residual");
    TORCH_CHECK_VALUE(broadcasts_over_leading_dims(res_in->sizes(), x_in.sizes()),
                      "residual must have x's shape ", x_in.sizes(), " or one that broadcasts to it over leading "
                      "dimensions only (e.g. [1, S, C] for [B, S, C]), got ", res_in->sizes());
  }
  check_vector(w_in, C, "weight");
  check_vector(b_in, C, "bias");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, "eps must be finite and >= 0, got ", eps);
  TORCH_CHECK_TYPE(checks::is_int8_type(dtype), "dtype must be torch.uint8 or torch.int8, got ",
                   checks::dtype_name(dtype));
  checks::scales(scales_in, C, "scales");
  checks::zero_point(zero_point, dtype, "zero_point");
  const int64_t qmin = dtype == at::kByte ? 0 : -128, top = dtype == at::kByte ? 255 : 127;
  TORCH_CHECK_VALUE(qmax >= qmin && qmax <= top, "qmax must be in [", qmin, ", ", top, "], got ", qmax);

  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(dtype));
  if (x.numel() == 0) return {y, q};
  const at::Tensor scales = scales_in.contiguous();
  if (!qbackend::cpu::has(qbackend::cpu::Isa::Avx512)) {
    at::Tensor s = has_res ? x + *res_in : x;
    y.copy_(at::layer_norm(s, {C}, w_in, b_in, eps));
    at::Tensor t = at::nan_to_num(y / scales, 0.0, INFINITY, -INFINITY);
    q.copy_(at::clamp(at::round(t) + double(zero_point), double(qmin), double(qmax)));
    return {y, q};
  }
  const at::Tensor res = has_res ? res_in->contiguous() : at::Tensor();
  const at::Tensor w = w_in.has_value() && w_in->defined() ? w_in->contiguous() : at::Tensor();
  const at::Tensor b = b_in.has_value() && b_in->defined() ? b_in->contiguous() : at::Tensor();
  kernels::LayerNormQuantRow p;
  p.C = C, p.eps = static_cast<float>(eps);
  p.w = w.defined() ? w.const_data_ptr<float>() : nullptr;
  p.b = b.defined() ? b.const_data_ptr<float>() : nullptr;
  p.scale = scales.const_data_ptr<float>();
  p.zp = static_cast<int32_t>(zero_point), p.qmin = static_cast<int32_t>(qmin), p.qmax = static_cast<int32_t>(qmax);
  p.u8 = dtype == at::kByte;
  const float* xp = x.const_data_ptr<float>();
  const float* rp = has_res ? res.const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  char* qp = static_cast<char*>(q.mutable_data_ptr());
  const int64_t rows = x.numel() / C;
  const int64_t res_rows = has_res ? std::max<int64_t>(1, res.numel() / C) : 1;  // the residual's period
  parallel::parallel_for(0, rows, std::max<int64_t>(1, kGrain / C), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      kernels::layer_norm_quantize_row_avx512(p, xp + i * C, rp ? rp + (i % res_rows) * C : nullptr, yp + i * C,
                                              qp + i * C);
  });
  return {y, q};
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("layer_norm_quantize(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, Tensor scales, "
        "int zero_point, ScalarType dtype, int qmax) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("layer_norm_quantize", &qbackend::ops::layer_norm_quantize); }
