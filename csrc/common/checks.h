// Argument checks shared by the qbackend ops. Each message names the argument it is about.
// TORCH_CHECK_TYPE surfaces in Python as TypeError, TORCH_CHECK_VALUE as ValueError.
#pragma once
#include <ATen/core/Tensor.h>

#include <cmath>
#include <string>

namespace qbackend::checks {

// Python's names (torch.int8, not c10's "Char"), as in the quantize ops' messages.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kFloat: return "torch.float32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

inline void cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), name, " must be a tensor, got None");
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got device ", t.device());
  TORCH_CHECK_TYPE(t.layout() == at::kStrided, name, " must be a dense (strided) tensor, got layout ",
                   t.layout());
}

inline void dtype(const at::Tensor& t, at::ScalarType want, const char* name) {
  cpu(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == want, name, " must have dtype ", dtype_name(want), ", got ",
                   dtype_name(t.scalar_type()));
}

inline void int8_activation(const at::Tensor& t, const char* name) {
  cpu(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte || t.scalar_type() == at::kChar, name,
                   " must have dtype uint8 or int8 (a quantized activation), got ",
                   dtype_name(t.scalar_type()));
}

inline void scale(double s, const char* name);
inline void zero_point(int64_t zp, at::ScalarType t, const char* name);

// A quantized activation x with its qparams (the first checks of every int8 op).
inline void activation(const at::Tensor& x, double x_scale, int64_t x_zero_point) {
  int8_activation(x, "x");
  scale(x_scale, "x_scale");
  zero_point(x_zero_point, x.scalar_type(), "x_zero_point");
}

// Every provider accumulates u8 x s8 products in int32: a reduction of K <= 65536 products
// (|x - zp| <= 255, |w| <= 128) cannot overflow it; a longer one can, so it is refused.
inline void int32_reduction(int64_t K, const char* what) {
  TORCH_CHECK_VALUE(K <= 65536, what, " <= 65536 is required: the int8 ops accumulate in int32, which a longer "
                    "reduction can overflow; got ", K);
}

inline void scale(double s, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(s) && s > 0.0, name, " must be a finite positive number, got ", s);
  const float f = static_cast<float>(s);
  TORCH_CHECK_VALUE(std::isfinite(f) && f > 0.0f && std::isfinite(1.0f / f), name, " = ", s,
                    " is not representable as a usable float32 scale");
}

inline void scales(const at::Tensor& s, int64_t n, const char* name) {
  dtype(s, at::kFloat, name);
  TORCH_CHECK_VALUE(s.dim() == 1 && s.numel() == n, name, " must be 1-D with ", n,
                    " elements (one per output channel), got shape ", s.sizes());
  const at::Tensor c = s.contiguous();
  const float* p = c.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK_VALUE(std::isfinite(p[i]) && p[i] > 0.0f, name, "[", i,
                      "] must be a finite positive number, got ", p[i]);
}

inline void zero_point(int64_t zp, at::ScalarType t, const char* name) {
  const int64_t lo = t == at::kByte ? 0 : -128;
  const int64_t hi = t == at::kByte ? 255 : 127;
  TORCH_CHECK_VALUE(zp >= lo && zp <= hi, name, " must be in [", lo, ", ", hi, "] for ",
                    dtype_name(t), ", got ", zp);
}

inline void output_dtype(at::ScalarType t, const char* name) {
  TORCH_CHECK_TYPE(t == at::kByte || t == at::kChar || t == at::kFloat || t == at::kBFloat16, name,
                   " must be uint8, int8, float32 or bfloat16, got ", dtype_name(t));
}

inline bool is_int8_type(at::ScalarType t) { return t == at::kByte || t == at::kChar; }

// The requantization target is only checked (and only used) for integer outputs.
inline void output_qparams(double s, int64_t zp, at::ScalarType t) {
  output_dtype(t, "output_dtype");
  if (!is_int8_type(t)) return;
  scale(s, "output_scale");
  zero_point(zp, t, "output_zero_point");
}

inline void bias(const std::optional<at::Tensor>& b, int64_t n) {
  if (!b.has_value() || !b->defined()) return;
  dtype(*b, at::kFloat, "bias");
  TORCH_CHECK_VALUE(b->dim() == 1 && b->numel() == n, "bias must be 1-D with ", n,
                    " elements, got shape ", b->sizes());
}

// "none" | "relu" | "gelu" (exact erf gelu).
enum class PostOp { none, relu, gelu };
inline PostOp post_op(const std::string& s) {
  if (s == "none" || s.empty()) return PostOp::none;
  if (s == "relu") return PostOp::relu;
  if (s == "gelu") return PostOp::gelu;
  TORCH_CHECK_VALUE(false, "post_op must be 'none', 'relu' or 'gelu', got '", s, "'");
}

}  // namespace qbackend::checks
