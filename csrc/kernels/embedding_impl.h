// The embedding-bag kernel body (see embedding_kernels.h), included by one translation unit per
// ISA (embedding_<isa>.cpp), each compiled for its target: the inner loops are written for the
// compiler to vectorize (contiguous fp32 fma over `dim`). std::fma keeps one rounding on every
// ISA, so all of them give the same bits.
//
// Include it AFTER the translation unit's `#pragma GCC target` (and after the standard headers,
// which must not be compiled for the target): its functions take the target from where they
// are defined. Everything here has internal linkage (an anonymous namespace), so the per-ISA
// copies of the templates never merge at link time.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/embedding_kernels.h"

namespace qbackend::kernels {
namespace {

inline float half_to_float(uint16_t h) {  // exact IEEE binary16 -> binary32 (vcvtph2ps with F16C)
  _Float16 f;
  std::memcpy(&f, &h, sizeof f);
  return static_cast<float>(f);
}

[[maybe_unused]] inline float half_to_float_bits(uint16_t h) {  // the same, by hand (reference)
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <bool Fp32QParams>
inline void qparams(const uint8_t* p, float& scale, float& bias) {
  if constexpr (Fp32QParams) {
    std::memcpy(&scale, p, 4);
    std::memcpy(&bias, p + 4, 4);
  } else {
    uint16_t s, b;
    std::memcpy(&s, p, 2);
    std::memcpy(&b, p + 2, 2);
    scale = half_to_float(s);
    bias = half_to_float(b);
  }
}

constexpr int64_t kPrefetch = 8;   // rows ahead
constexpr int64_t kChunk = 256;    // 4-bit: elements unpacked per step

template <int Bits, bool Fp32QParams, typename Index>
void bag(const EmbeddingBagArgs<Index>& a, int64_t bag_begin, int64_t bag_end) {
  const int64_t dim = a.dim;
  constexpr int64_t qp_bytes = Fp32QParams ? 8 : 4;
  for (int64_t b = bag_begin; b < bag_end; ++b) {
    float* __restrict o = a.out + b * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = 0.f;
    const int64_t start = static_cast<int64_t>(a.offsets[b]);
    const int64_t end = b + 1 < a.num_bags ? static_cast<int64_t>(a.offsets[b + 1]) : a.last_end;
    int64_t count = 0;
    for (int64_t i = start; i < end; ++i) {
      if (i + kPrefetch < end) __builtin_prefetch(a.table + static_cast<int64_t>(a.indices[i + kPrefetch]) * a.row_bytes);
      const int64_t idx = static_cast<int64_t>(a.indices[i]);
      if (idx == a.padding_idx) continue;
      ++count;
      const uint8_t* __restrict row = a.table + idx * a.row_bytes;  // [scale][bias][data]
      float scale, bias;
      qparams<Fp32QParams>(row, scale, bias);
      row += qp_bytes;
      if (a.weights != nullptr) {
        scale *= a.weights[i];
        bias *= a.weights[i];
      }
      if constexpr (Bits == 8) {
        for (int64_t d = 0; d < dim; ++d) o[d] = std::fma(scale, static_cast<float>(row[d]), o[d] + bias);
      } else {
        uint8_t q[kChunk];
        for (int64_t c = 0; c < dim; c += kChunk) {
          const int64_t n = dim - c < kChunk ? dim - c : kChunk;
          const uint8_t* __restrict src = row + c / 2;
          for (int64_t j = 0; j < n / 2; ++j) {
            q[2 * j] = src[j] & 0x0f;
            q[2 * j + 1] = src[j] >> 4;
          }
          float* __restrict oc = o + c;
          for (int64_t d = 0; d < n; ++d) oc[d] = std::fma(scale, static_cast<float>(q[d]), oc[d] + bias);
        }
      }
    }
    if (a.mean && count > 0) {
      const float inv = 1.f / static_cast<float>(count);
      for (int64_t d = 0; d < dim; ++d) o[d] *= inv;
    }
  }
}

inline EmbeddingKernels make_embedding_kernels(const char* name) {
  return EmbeddingKernels{name,
                          {{bag<8, false, int32_t>, bag<8, true, int32_t>}, {bag<4, false, int32_t>, bag<4, true, int32_t>}},
                          {{bag<8, false, int64_t>, bag<8, true, int64_t>}, {bag<4, false, int64_t>, bag<4, true, int64_t>}}};
}

}  // namespace
}  // namespace qbackend::kernels
