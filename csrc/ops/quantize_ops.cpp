// torch ops qbackend::{quantize,dequantize}_per_{tensor,channel}: argument checks, threading and
// the run-time choice of kernel (csrc/kernels/quantize_*.cpp by cpu::kernel_table).
//
// Decisions: inputs of any rank/size/strides (non-contiguous inputs are made contiguous first);
// outputs are contiguous with the input's shape (per-tensor ops keep a channels-last 4-D layout;
// quantize_per_tensor's memory_format asks for contiguous or channels-last); empty in -> empty out. NaN quantizes to the zero
// point, +-inf to qmax/qmin (no NaN scan on the hot path). Per-channel scales may be float32 or
// float64 (rounded to float32, like a Python float scale); zero points any integer dtype.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cpu/kernel_table.h"
#include "kernels/quantize_kernels.h"
#include "runtime/activation_cache.h"
#include "runtime/parallel.h"

namespace qbackend::ops {
namespace {

using at::ScalarType;
using kernels::QuantizeKernels;

constexpr int64_t kGrain = 32768;   // elements per at::parallel_for task
constexpr int64_t kRunMin = 64;     // per-channel: runs shorter than this use expanded parameters

const QuantizeKernels& pick_kernels() {
  return cpu::kernel_table(&kernels::quantize_kernels_scalar, &kernels::quantize_kernels_avx2,
                           &kernels::quantize_kernels_avx512);
}

std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Float: return "torch.float32";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Bool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

void check_qdtype(ScalarType dtype, const char* arg) {
  TORCH_CHECK_VALUE(dtype == ScalarType::Byte || dtype == ScalarType::Char, arg,
                    " must be torch.uint8 or torch.int8, got ", dtype_name(dtype));
}

int32_t qmin(ScalarType t) { return t == ScalarType::Byte ? 0 : -128; }
int32_t qmax(ScalarType t) { return t == ScalarType::Byte ? 255 : 127; }

void check_cpu(const at::Tensor& t, const char* arg) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor, got a tensor on ", t.device());
}

float checked_scale(double scale, const char* arg) {
  const float s = static_cast<float>(scale);
  TORCH_CHECK_VALUE(std::isfinite(s) && s > 0.0f, arg, " must be a finite positive number, got ", scale,
                    (std::isfinite(scale) && scale > 0.0) ? " (not a positive finite float32)" : "");
  return s;
}

int32_t checked_zero_point(int64_t zp, ScalarType qdtype, const char* arg) {
  TORCH_CHECK_VALUE(zp >= qmin(qdtype) && zp <= qmax(qdtype), arg, " must be in [", qmin(qdtype), ", ",
                    qmax(qdtype), "] for ", dtype_name(qdtype), ", got ", zp);
  return static_cast<int32_t>(zp);
}

// Per-channel parameters, validated and converted to float32 / int32 vectors.
struct ChannelParams {
  int64_t outer = 1, channels = 1, inner = 1;
  std::vector<float> scales;
  std::vector<int32_t> zero_points;
};

ChannelParams channel_params(const at::Tensor& x, const char* xname, const at::Tensor& scales,
                             const at::Tensor& zero_points, int64_t axis, ScalarType qdtype) {
  const int64_t d = x.dim();
  TORCH_CHECK_VALUE(d >= 1, "axis cannot index a 0-d ", xname, ": per-channel needs at least 1 dimension");
  TORCH_CHECK_VALUE(axis >= -d && axis < d, "axis must be in [", -d, ", ", d, ") for ", xname, " with ", d,
                    " dimensions, got ", axis);
  if (axis < 0) axis += d;
  check_cpu(scales, "scales");
  check_cpu(zero_points, "zero_points");
  TORCH_CHECK_TYPE(scales.scalar_type() == ScalarType::Float || scales.scalar_type() == ScalarType::Double,
                   "scales must be a float32 (or float64) tensor, got ", dtype_name(scales.scalar_type()));
  TORCH_CHECK_TYPE(at::isIntegralType(zero_points.scalar_type(), /*includeBool=*/false),
                   "zero_points must be an integer tensor, got ", dtype_name(zero_points.scalar_type()));
  ChannelParams p;
  p.channels = x.size(axis);
  for (int64_t i = 0; i < axis; ++i) p.outer *= x.size(i);
  for (int64_t i = axis + 1; i < d; ++i) p.inner *= x.size(i);
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.size(0) == p.channels, "scales must be 1-D of length ",
                    xname, ".size(", axis, ") = ", p.channels, ", got shape ", scales.sizes());
  TORCH_CHECK_VALUE(zero_points.dim() == 1 && zero_points.size(0) == p.channels,
                    "zero_points must be 1-D of length ", xname, ".size(", axis, ") = ", p.channels,
                    ", got shape ", zero_points.sizes());
  const at::Tensor s = scales.to(ScalarType::Float).contiguous();
  const at::Tensor z = zero_points.to(ScalarType::Long).contiguous();
  const float* sp = s.const_data_ptr<float>();
  const int64_t* zp = z.const_data_ptr<int64_t>();
  p.scales.assign(sp, sp + p.channels);
  p.zero_points.resize(p.channels);
  for (int64_t c = 0; c < p.channels; ++c) {
    TORCH_CHECK_VALUE(std::isfinite(sp[c]) && sp[c] > 0.0f, "scales must be finite positive numbers, got scales[",
                      c, "] = ", sp[c], " (as float32)");
    TORCH_CHECK_VALUE(zp[c] >= qmin(qdtype) && zp[c] <= qmax(qdtype), "zero_points must be in [", qmin(qdtype),
                      ", ", qmax(qdtype), "] for ", dtype_name(qdtype), ", got zero_points[", c, "] = ", zp[c]);
    p.zero_points[c] = static_cast<int32_t>(zp[c]);
  }
  return p;
}

template <typename In, typename Out>
using TensorFn = void (*)(const In*, Out*, int64_t, float, int32_t);
template <typename In, typename Out>
using ElemFn = void (*)(const In*, Out*, int64_t, const float*, const int32_t*);

template <typename In, typename Out>
void run_per_tensor(TensorFn<In, Out> fn, const In* x, Out* y, int64_t n, float s, int32_t z) {
  parallel::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b, s, z); });
}

template <typename In, typename Out>
void run_per_channel(TensorFn<In, Out> run_fn, ElemFn<In, Out> elem_fn, const In* x, Out* y,
                     const ChannelParams& p) {
  const int64_t C = p.channels, inner = p.inner;
  if (inner >= kRunMin) {  // long runs of one channel: one per-tensor call per run
    const int64_t runs = p.outer * C;
    parallel::parallel_for(0, runs, std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        run_fn(x + r * inner, y + r * inner, inner, p.scales[r % C], p.zero_points[r % C]);
    });
    return;
  }
  // short runs: parameters expanded over one period of C * inner elements
  const int64_t period = C * inner;
  std::vector<float> s(period);
  std::vector<int32_t> z(period);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < inner; ++j) {
      s[c * inner + j] = p.scales[c];
      z[c * inner + j] = p.zero_points[c];
    }
  parallel::parallel_for(0, p.outer * period, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      const int64_t off = i % period, len = std::min(e - i, period - off);
      elem_fn(x + i, y + i, len, s.data() + off, z.data() + off);
      i += len;
    }
  });
}

const uint16_t* bf16_ptr(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}
uint16_t* bf16_ptr(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); }

void check_quantize_input(const at::Tensor& x, ScalarType dtype) {
  check_cpu(x, "x");
  TORCH_CHECK_TYPE(x.scalar_type() == ScalarType::Float || x.scalar_type() == ScalarType::BFloat16,
                   "x must be a float32 or bfloat16 tensor, got ", dtype_name(x.scalar_type()));
  check_qdtype(dtype, "dtype");
}

void check_dequantize_input(const at::Tensor& q, ScalarType out_dtype) {
  check_cpu(q, "q");
  TORCH_CHECK_TYPE(q.scalar_type() == ScalarType::Byte || q.scalar_type() == ScalarType::Char,
                   "q must be a uint8 or int8 tensor, got ", dtype_name(q.scalar_type()));
  TORCH_CHECK_VALUE(out_dtype == ScalarType::Float || out_dtype == ScalarType::BFloat16,
                    "out_dtype must be torch.float32 or torch.bfloat16, got ", dtype_name(out_dtype));
}

// Calls f(in_ptr, out_ptr, per_tensor_fn, per_element_fn) with the typed kernels for the dtypes.
template <typename F>
void with_quantize_fns(const at::Tensor& x, at::Tensor& q, F f) {
  const auto& k = pick_kernels();
  const bool u8 = q.scalar_type() == ScalarType::Byte;
  if (x.scalar_type() == ScalarType::Float) {
    const float* xp = x.const_data_ptr<float>();
    if (u8) f(xp, q.mutable_data_ptr<uint8_t>(), k.q_f32_u8, k.qv_f32_u8);
    else f(xp, q.mutable_data_ptr<int8_t>(), k.q_f32_s8, k.qv_f32_s8);
  } else {
    const uint16_t* xp = bf16_ptr(x);
    if (u8) f(xp, q.mutable_data_ptr<uint8_t>(), k.q_bf16_u8, k.qv_bf16_u8);
    else f(xp, q.mutable_data_ptr<int8_t>(), k.q_bf16_s8, k.qv_bf16_s8);
  }
}

template <typename F>
void with_dequantize_fns(const at::Tensor& q, at::Tensor& y, F f) {
  const auto& k = pick_kernels();
  const bool u8 = q.scalar_type() == ScalarType::Byte;
  if (y.scalar_type() == ScalarType::Float) {
    float* yp = y.mutable_data_ptr<float>();
    if (u8) f(q.const_data_ptr<uint8_t>(), yp, k.dq_u8_f32, k.dqv_u8_f32);
    else f(q.const_data_ptr<int8_t>(), yp, k.dq_s8_f32, k.dqv_s8_f32);
  } else {
    uint16_t* yp = bf16_ptr(y);
    if (u8) f(q.const_data_ptr<uint8_t>(), yp, k.dq_u8_bf16, k.dqv_u8_bf16);
    else f(q.const_data_ptr<int8_t>(), yp, k.dq_s8_bf16, k.dqv_s8_bf16);
  }
}

// Per-tensor ops are elementwise: a channels-last 4-D tensor is processed in its own memory order
// and the output keeps that layout (activations stay channels-last between convs).
at::Tensor dense(const at::Tensor& t) {
  return t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) ? t : t.contiguous();
}

// An output laid out as the dense input t (dense(): contiguous, else channels-last), so that the
// kernels walk both in the same linear order.
at::Tensor dense_like(const at::Tensor& t, ScalarType dtype) {
  return runtime::empty_output(t.sizes(), t.options().dtype(dtype).memory_format(
      t.is_contiguous() ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast));
}

// A channels-first image quantized into a channels-last output: per image row, each channel's W
// values quantized into a scratch row (the per-tensor kernel), then interleaved into W pixels of
// C bytes. The same values as quantizing then converting the layout, without the second pass.
template <typename In, typename Out>
void run_per_tensor_to_channels_last(TensorFn<In, Out> fn, void (*interleave)(const uint8_t*, int64_t, int64_t,
                                                                              int64_t, uint8_t*),
                                     const In* x, Out* y, int64_t N, int64_t C, int64_t H, int64_t W, float s,
                                     int32_t z) {
  parallel::parallel_for(0, N * H, std::max<int64_t>(1, kGrain / (C * W)), [&](int64_t b, int64_t e) {
    static thread_local std::vector<uint8_t> scratch;
    if (static_cast<int64_t>(scratch.size()) < C * W) scratch.resize(static_cast<size_t>(C * W));
    Out* row = reinterpret_cast<Out*>(scratch.data());
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / H, h = r % H;
      for (int64_t c = 0; c < C; ++c) fn(x + ((n * C + c) * H + h) * W, row + c * W, W, s, z);
      interleave(scratch.data(), W, C, W, reinterpret_cast<uint8_t*>(y + r * W * C));
    }
  });
}

at::Tensor quantize_per_tensor(const at::Tensor& x_in, double scale, int64_t zero_point, ScalarType dtype,
                               std::optional<at::MemoryFormat> memory_format) {
  check_quantize_input(x_in, dtype);
  const float s = checked_scale(scale, "scale");
  const int32_t z = checked_zero_point(zero_point, dtype, "zero_point");
  const at::MemoryFormat format = memory_format.value_or(at::MemoryFormat::Preserve);
  TORCH_CHECK_VALUE(format == at::MemoryFormat::Preserve || format == at::MemoryFormat::Contiguous ||
                        format == at::MemoryFormat::ChannelsLast,
                    "memory_format must be None, torch.preserve_format, torch.contiguous_format or "
                    "torch.channels_last, got ", format);
  TORCH_CHECK_VALUE(format != at::MemoryFormat::ChannelsLast || x_in.dim() == 4,
                    "memory_format=torch.channels_last takes a 4-D x, got a ", x_in.dim(), "-D tensor");
  if (format == at::MemoryFormat::ChannelsLast && !x_in.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    const at::Tensor x = x_in.contiguous();
    at::Tensor q = runtime::empty_output(x.sizes(), x.options().dtype(dtype).memory_format(format));
    if (x.numel() == 0) return q;
    const auto& k = pick_kernels();
    with_quantize_fns(x, q, [&](auto xp, auto qp, auto fn, auto) {
      run_per_tensor_to_channels_last(fn, k.interleave_u8, xp, qp, x.size(0), x.size(1), x.size(2), x.size(3), s, z);
    });
    return q;
  }
  const at::Tensor x = dense(x_in);
  at::Tensor q = dense_like(x, dtype);
  const int64_t n = x.numel();
  if (n > 0)
    with_quantize_fns(x, q, [&](auto xp, auto qp, auto fn, auto) { run_per_tensor(fn, xp, qp, n, s, z); });
  if (format == at::MemoryFormat::Contiguous && !q.is_contiguous()) return q.contiguous();
  return q;
}

at::Tensor quantize_per_channel(const at::Tensor& x_in, const at::Tensor& scales, const at::Tensor& zero_points,
                                int64_t axis, ScalarType dtype) {
  check_quantize_input(x_in, dtype);
  const ChannelParams p = channel_params(x_in, "x", scales, zero_points, axis, dtype);
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = runtime::empty_output(x.sizes(), x.options().dtype(dtype));
  if (x.numel() == 0) return q;
  with_quantize_fns(x, q, [&](auto xp, auto qp, auto fn, auto vfn) { run_per_channel(fn, vfn, xp, qp, p); });
  return q;
}

at::Tensor dequantize_per_tensor(const at::Tensor& q_in, double scale, int64_t zero_point, ScalarType out_dtype) {
  check_dequantize_input(q_in, out_dtype);
  const float s = checked_scale(scale, "scale");
  const int32_t z = checked_zero_point(zero_point, q_in.scalar_type(), "zero_point");
  const at::Tensor q = dense(q_in);
  at::Tensor y = dense_like(q, out_dtype);
  const int64_t n = q.numel();
  if (n == 0) return y;
  with_dequantize_fns(q, y, [&](auto qp, auto yp, auto fn, auto) { run_per_tensor(fn, qp, yp, n, s, z); });
  return y;
}

at::Tensor dequantize_per_channel(const at::Tensor& q_in, const at::Tensor& scales, const at::Tensor& zero_points,
                                  int64_t axis, ScalarType out_dtype) {
  check_dequantize_input(q_in, out_dtype);
  const ChannelParams p = channel_params(q_in, "q", scales, zero_points, axis, q_in.scalar_type());
  const at::Tensor q = q_in.contiguous();
  at::Tensor y = runtime::empty_output(q.sizes(), q.options().dtype(out_dtype));
  if (q.numel() == 0) return y;
  with_dequantize_fns(q, y, [&](auto qp, auto yp, auto fn, auto vfn) { run_per_channel(fn, vfn, qp, yp, p); });
  return y;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("quantize_per_tensor(Tensor x, float scale, int zero_point, ScalarType dtype, "
        "MemoryFormat? memory_format=None) -> Tensor");
  m.def("quantize_per_channel(Tensor x, Tensor scales, Tensor zero_points, int axis, ScalarType dtype) -> Tensor");
  m.def("dequantize_per_tensor(Tensor q, float scale, int zero_point, ScalarType out_dtype=float) -> Tensor");
  m.def("dequantize_per_channel(Tensor q, Tensor scales, Tensor zero_points, int axis, "
        "ScalarType out_dtype=float) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("quantize_per_tensor", &qbackend::ops::quantize_per_tensor);
  m.impl("quantize_per_channel", &qbackend::ops::quantize_per_channel);
  m.impl("dequantize_per_tensor", &qbackend::ops::dequantize_per_tensor);
  m.impl("dequantize_per_channel", &qbackend::ops::dequantize_per_channel);
}
