// The fbgemm provider for Linear: FBGEMM's int8 GEMM (PackAWithRowOffset x PackBMatrix) with
// ReQuantizeOutput (uint8/int8 out) or ReQuantizeForFloat (fp32/bf16 out), on plain tensors.
//
// Ops (torch.ops.qbackend):
//   fbgemm_linear_prepack(Tensor weight) -> Tensor      int8 [N, K] -> packed handle tensor
//   fbgemm_linear(x, x_scale, x_zero_point, w_packed, w_scales, bias, output_scale,
//                 output_zero_point, output_dtype, post_op) -> Tensor
//   fbgemm_linear_dynamic(x, w_packed, w_scales, bias, reduce_range, post_op) -> Tensor
// FBGEMM wants uint8 activations: int8 ones are shifted by +128 (exact). int8 output is computed
// as uint8 with zero point + 128 and shifted back (exact). gelu and bf16 output are not FBGEMM
// epilogues: they run after the fp32 output (unfused, documented in the dispatcher's table).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>

#include <cstdlib>
#include <cstring>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <fbgemm/Fbgemm.h>

#include "common/checks.h"
#include "common/epilogue.h"
#include "providers/fbgemm_requant.h"
#include "common/opaque_handle.h"
#include "common/saturation.h"
#include "runtime/parallel.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

struct FbgemmLinearWeight {
  int64_t N = 0, K = 0;
  std::vector<int32_t> col_offsets;  // sum_k w[n, k]
  std::vector<int32_t> w_zero_points;  // all 0 (symmetric weights), FBGEMM wants the array
  // The packed buffer, ours and zero-filled before FBGEMM packs into it: FBGEMM leaves the padding
  // of its panels unwritten, so with its own (uninitialised) buffer two packs of one weight differed
  // in those bytes; zeroed, the handle's bytes depend on the weight only.
  std::unique_ptr<int8_t, void (*)(void*)> buffer{nullptr, std::free};
  std::unique_ptr<fbgemm::PackBMatrix<int8_t>> packed;
};

constexpr const char* kWhat = "FBGEMM linear weight (qbackend.fbgemm_linear_prepack)";

at::Tensor fbgemm_linear_prepack(const at::Tensor& weight) {
  checks::dtype(weight, at::kChar, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-D [out_features, in_features], got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight.numel() > 0, "weight must not be empty, got shape ", weight.sizes());
  checks::int32_reduction(weight.size(1), "in_features");
  TORCH_CHECK_VALUE(weight.size(0) < (1 << 30) && weight.size(1) < (1 << 30),
                    "weight is too large for FBGEMM (int32 sizes), got shape ", weight.sizes());
  const at::Tensor w = weight.contiguous();
  auto h = std::make_unique<FbgemmLinearWeight>();
  h->N = w.size(0);
  h->K = w.size(1);
  const int8_t* wp = w.data_ptr<int8_t>();
  h->col_offsets.resize(h->N);
  for (int64_t n = 0; n < h->N; ++n) {
    int32_t s = 0;
    for (int64_t k = 0; k < h->K; ++k) s += wp[n * h->K + k];
    h->col_offsets[n] = s;
  }
  h->w_zero_points.assign(h->N, 0);
  const int64_t nbytes =
      fbgemm::PackBMatrix<int8_t>::packedBufferSize(static_cast<int>(h->K), static_cast<int>(h->N));
  const size_t alloc = (static_cast<size_t>(nbytes) + 63) / 64 * 64;
  h->buffer.reset(static_cast<int8_t*>(std::aligned_alloc(64, alloc)));
  TORCH_CHECK(h->buffer != nullptr, "fbgemm_linear_prepack: out of memory (", alloc, " bytes)");
  std::memset(h->buffer.get(), 0, alloc);
  // B is K x N; the int8 weight is N x K row-major, i.e. B transposed with leading dimension K.
  h->packed = std::make_unique<fbgemm::PackBMatrix<int8_t>>(
      fbgemm::matrix_op_t::Transpose, static_cast<int32_t>(h->K), static_cast<int32_t>(h->N), wp,
      static_cast<int32_t>(h->K), h->buffer.get(), 1);
  void* buf = h->packed->getBuf();
  return wrap_opaque(std::move(h), buf, {nbytes});
}

// x as a contiguous [M, K] uint8 matrix with its zero point (int8 input shifted by +128).
struct U8Input {
  at::Tensor t;
  int32_t zp;
};

U8Input as_u8(const at::Tensor& x2d, int64_t zp) {
  if (x2d.scalar_type() == at::kByte) return {x2d.contiguous(), static_cast<int32_t>(zp)};
  return {shift_int8_to_uint8(x2d.contiguous()), static_cast<int32_t>(zp + 128)};
}

int num_tasks_for(int64_t M, int64_t N, int64_t K) {
  // A second thread only pays off from about 100 us of work on one
  // (benchmarks/results/design_measurements.md, "FBGEMM threading thresholds").
  const int64_t work = M * N * K;
  return work < (int64_t(1) << 22) ? 1 : at::get_num_threads();
}

// One FBGEMM GEMM of x [M, K] (packed per task with row offsets) by the packed weight, split in
// num_tasks_for tasks; make_proc(row_offsets) builds the output processor (the epilogue).
template <typename OutT, typename MakeProc>
void run_gemm(const U8Input& x, int64_t M, const FbgemmLinearWeight& w, OutT* out, int32_t* acc,
              const MakeProc& make_proc) {
  const int num_tasks = num_tasks_for(M, w.N, w.K);
  parallel::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> row_offsets(fbgemm::PackAWithRowOffset<uint8_t>::rowOffsetBufferSize());
    for (int64_t task = begin; task < end; ++task) {
      fbgemm::PackAWithRowOffset<uint8_t> packA(
          fbgemm::matrix_op_t::NoTranspose, static_cast<uint32_t>(M), static_cast<uint32_t>(w.K),
          x.t.data_ptr<uint8_t>(), static_cast<uint32_t>(w.K), nullptr, 1, row_offsets.data());
      const auto proc = make_proc(packA.getRowOffsetBuffer());
      fbgemm::fbgemmPacked(packA, *w.packed, out, acc, static_cast<uint32_t>(w.N), proc, static_cast<int>(task),
                           num_tasks);
    }
  });
}

template <bool RELU>
void gemm_u8(const U8Input& x, int64_t M, const FbgemmLinearWeight& w, const float* multiplier,
             const float* act_times_w_scale, int32_t out_zp, const float* bias, uint8_t* out) {
  at::Tensor acc = at::empty({M, w.N}, at::kInt);
  fbgemm::DoNothing<> nothing;
  run_gemm(x, M, w, out, acc.data_ptr<int32_t>(), [&](const int32_t* row_offsets) {
    return fbgemm::ReQuantizeOutput<RELU, fbgemm::QuantizationGranularity::OUT_CHANNEL, float>(
        nothing, multiplier, out_zp, x.zp, w.w_zero_points.data(), row_offsets, w.col_offsets.data(), bias,
        static_cast<uint32_t>(w.N), 1, act_times_w_scale);
  });
}

template <bool RELU>
void gemm_f32(const U8Input& x, int64_t M, const FbgemmLinearWeight& w, float x_scale,
              const float* w_scales, const float* bias, float* out) {
  fbgemm::DoNothing<float, float> nothing;
  // ReQuantizeForFloat works in place on the int32 accumulators stored in `out`.
  run_gemm(x, M, w, out, reinterpret_cast<int32_t*>(out), [&](const int32_t* row_offsets) {
    return fbgemm::ReQuantizeForFloat<RELU, fbgemm::QuantizationGranularity::OUT_CHANNEL>(
        nothing, x_scale, w_scales, x.zp, w.w_zero_points.data(), row_offsets, w.col_offsets.data(), bias,
        static_cast<uint32_t>(w.N), 1);
  });
}

// Checks shared by the static and dynamic entry points; returns the weight and the output shape.
const FbgemmLinearWeight& check_common(const at::Tensor& x, const at::Tensor& w_packed,
                                       const at::Tensor& w_scales,
                                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension [..., in_features], got a 0-d tensor");
  const FbgemmLinearWeight& w = unwrap_opaque<FbgemmLinearWeight>(w_packed, "w_packed", kWhat);
  TORCH_CHECK_VALUE(x.size(-1) == w.K, "x's last dimension (in_features) must be ", w.K,
                    " to match the weight, got shape ", x.sizes());
  checks::scales(w_scales, w.N, "w_scales");
  checks::bias(bias, w.N);
  return w;
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t N) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = N;
  return s;
}

// The fp32 GEMM output for already-validated arguments, x_u8 [M, K].
at::Tensor linear_f32(const U8Input& xu, int64_t M, const FbgemmLinearWeight& w, double x_scale,
                      const at::Tensor& w_scales, const float* bias, bool relu) {
  at::Tensor y = at::empty({M, w.N}, at::kFloat);
  const float* ws = w_scales.data_ptr<float>();
  if (relu) gemm_f32<true>(xu, M, w, static_cast<float>(x_scale), ws, bias, y.data_ptr<float>());
  else gemm_f32<false>(xu, M, w, static_cast<float>(x_scale), ws, bias, y.data_ptr<float>());
  return y;
}

at::Tensor fbgemm_linear(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                         const at::Tensor& w_packed, const at::Tensor& w_scales,
                         const std::optional<at::Tensor>& bias, double output_scale,
                         int64_t output_zero_point, at::ScalarType output_dtype,
                         const std::string& post_op) {
  checks::activation(x, x_scale, x_zero_point);
  const FbgemmLinearWeight& w = check_common(x, w_packed, w_scales, bias);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const checks::PostOp op = checks::post_op(post_op);
  const auto shape = out_shape(x, w.N);
  const int64_t M = w.K > 0 ? x.numel() / w.K : 0;
  if (M == 0) return at::empty(shape, at::TensorOptions().dtype(output_dtype));

  if (!saturation::fbgemm_has_vnni()) saturation::require_7bit(x, "FBGEMM");
  const U8Input xu = as_u8(x.reshape({M, w.K}), x_zero_point);
  const at::Tensor ws = w_scales.contiguous();
  const at::Tensor keep_bias = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  const float* bp = keep_bias.defined() ? keep_bias.data_ptr<float>() : nullptr;

  const bool int_out = checks::is_int8_type(output_dtype);
  if (int_out && op != checks::PostOp::gelu) {
    const FbgemmRequant rq(x_scale, ws, output_scale, output_zero_point, output_dtype);
    if (rq.fits(w.K, bp)) {
      at::Tensor y = at::empty({M, w.N}, at::kByte);
      if (op == checks::PostOp::relu)
        gemm_u8<true>(xu, M, w, rq.multiplier.data(), rq.act_times_w.data(), rq.zero_point, bp, y.data_ptr<uint8_t>());
      else
        gemm_u8<false>(xu, M, w, rq.multiplier.data(), rq.act_times_w.data(), rq.zero_point, bp, y.data_ptr<uint8_t>());
      if (output_dtype == at::kChar) y = shift_uint8_to_int8_(y);
      return y.reshape(shape);
    }
  }
  at::Tensor y = linear_f32(xu, M, w, x_scale, ws, bp, op == checks::PostOp::relu);
  if (op == checks::PostOp::gelu) y = at::gelu(y);
  return finish_from_float(y, output_scale, output_zero_point, output_dtype).reshape(shape);
}

at::Tensor fbgemm_linear_dynamic(const at::Tensor& x, const at::Tensor& w_packed,
                                 const at::Tensor& w_scales, const std::optional<at::Tensor>& bias,
                                 bool reduce_range, const std::string& post_op) {
  checks::dtype(x, at::kFloat, "x");
  const FbgemmLinearWeight& w = check_common(x, w_packed, w_scales, bias);
  const checks::PostOp op = checks::post_op(post_op);
  const auto shape = out_shape(x, w.N);
  TORCH_CHECK_VALUE(reduce_range || saturation::fbgemm_has_vnni(),
                    "reduce_range must be True on this CPU (or QBACKEND_ISA): without VNNI, FBGEMM saturates "
                    "8-bit u8 x s8 products");
  const int64_t M = w.K > 0 ? x.numel() / w.K : 0;
  if (M == 0) return at::empty(shape, at::kFloat);
  const at::Tensor x2 = x.reshape({M, w.K}).contiguous();
  const DynamicQParams qp = choose_dynamic_qparams(x2, reduce_range, "x");
  const U8Input xu{quantize_u8(x2, qp.scale, qp.zero_point), qp.zero_point};
  const at::Tensor ws = w_scales.contiguous();
  at::Tensor keep_bias = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  at::Tensor y = linear_f32(xu, M, w, qp.scale, ws, keep_bias.defined() ? keep_bias.data_ptr<float>() : nullptr,
                            op == checks::PostOp::relu);
  if (op == checks::PostOp::gelu) y = at::gelu(y);
  return y.reshape(shape);
}

}  // namespace

// The schemas: providers/registrations.cpp.
void register_fbgemm_linear(torch::Library& m) {
  impl_each(m, "fbgemm_linear_prepack", &fbgemm_linear_prepack,
            "fbgemm_linear", &fbgemm_linear,
            "fbgemm_linear_dynamic", &fbgemm_linear_dynamic);
}

}  // namespace qbackend
