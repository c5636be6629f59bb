// Fused (residual add +) LayerNorm + quantize over the last dimension (no torch headers):
//   s = x + r (r optional), y = (s - mean(s)) / sqrt(var(s) + eps) * w + b (w, b optional),
//   q = clamp(round_half_even(y / scale[c]) + zp, qmin, qmax)   (the quantize_per_channel formula)
// mean and the biased variance in fp32, two passes over the row. One row per call.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

struct LayerNormQuantRow {
  int64_t C = 0;
  float eps = 1e-5f;
  const float* w = nullptr;  // [C] or null
  const float* b = nullptr;  // [C] or null
  const float* scale = nullptr;  // [C], finite > 0
  int32_t zp = 0, qmin = 0, qmax = 255;
  bool u8 = true;
};

// x, r (or null), y: rows of C floats; q: C bytes (uint8 or int8 by p.u8).
// Only call it when qbackend::cpu::has(qbackend::cpu::Isa::Avx512).
void layer_norm_quantize_row_avx512(const LayerNormQuantRow& p, const float* x, const float* r, float* y, void* q);

}  // namespace qbackend::kernels
