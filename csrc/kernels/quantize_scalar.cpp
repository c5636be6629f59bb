// Scalar (baseline x86-64) quantize/dequantize kernels: the fallback and the plainest statement of
// the contract in quantize_kernels.h.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/quantize_kernels.h"

namespace qbackend::kernels {
namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) {
  const uint32_t bits = uint32_t(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void from_f32(float v, float* out) { *out = v; }
inline void from_f32(float v, uint16_t* out) {  // round to nearest even, NaN stays a quiet NaN
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (std::isnan(v)) {
    *out = uint16_t((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *out = uint16_t(bits >> 16);
}

template <typename Q>
inline Q quant1(float x, float scale, int32_t zp) {
  float v = x / scale;
  if (std::isnan(v)) v = 0.0f;  // NaN -> zero point
  v = std::fmin(std::fmax(v, float(QRange<Q>::min - zp)), float(QRange<Q>::max - zp));
  return Q(int32_t(std::nearbyint(v)) + zp);  // clamped bounds are integers: clamp commutes with rounding
}

template <typename In, typename Q>
struct Quant {
  static void run(const In* x, Q* q, int64_t n, float scale, int32_t zp) {
    for (int64_t i = 0; i < n; ++i) q[i] = quant1<Q>(to_f32(x[i]), scale, zp);
  }
};

template <typename In, typename Q>
struct QuantV {
  static void run(const In* x, Q* q, int64_t n, const float* scale, const int32_t* zp) {
    for (int64_t i = 0; i < n; ++i) q[i] = quant1<Q>(to_f32(x[i]), scale[i], zp[i]);
  }
};

template <typename Q, typename Out>
struct Dequant {
  static void run(const Q* q, Out* y, int64_t n, float scale, int32_t zp) {
    for (int64_t i = 0; i < n; ++i) from_f32(float(int32_t(q[i]) - zp) * scale, &y[i]);
  }
};

template <typename Q, typename Out>
struct DequantV {
  static void run(const Q* q, Out* y, int64_t n, const float* scale, const int32_t* zp) {
    for (int64_t i = 0; i < n; ++i) from_f32(float(int32_t(q[i]) - zp[i]) * scale[i], &y[i]);
  }
};

constexpr QuantizeKernels kTable = make_quantize_kernels<Quant, QuantV, Dequant, DequantV>("scalar", interleave_u8_scalar);

}  // namespace

const QuantizeKernels& quantize_kernels_scalar() { return kTable; }

}  // namespace qbackend::kernels
