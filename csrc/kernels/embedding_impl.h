// The embedding-bag kernel body (see embedding_kernels.h), included by one translation unit per
// ISA (embedding_<isa>.cpp), each compiled for its target: the inner loops are written for the
// compiler to vectorize (contiguous fp32 fma over `dim`). std::fma keeps one rounding on every
// ISA, so all of them give the same bits.
//
// Include it AFTER the translation unit's `QB_TARGET` (cpu/targets.h) (and after the standard headers,
// which must not be compiled for the target): its functions take the target from where they
// are defined. Everything here has internal linkage (an anonymous namespace), so the per-ISA
// copies of the templates never merge at link time.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/embedding_kernels.h"
#include "kernels/half_float.h"

namespace qbackend::kernels {
namespace {

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

constexpr int64_t kPrefetch = 16;  // rows ahead (FBGEMM's distance)
constexpr int64_t kChunk = 64;     // output values accumulated in registers per pass over a bag

// The q values [c0, c0 + n) of a row's data, as uint8 levels (4-bit: unpacked; c0 is even).
template <int Bits>
inline const uint8_t* levels(const uint8_t* data, int64_t c0, int64_t n, uint8_t* buf) {
  if constexpr (Bits == 8) {
    return data + c0;
  } else {
    const uint8_t* src = data + c0 / 2;
    for (int64_t j = 0; j < (n + 1) / 2; ++j) {
      buf[2 * j] = src[j] & 0x0f;
      buf[2 * j + 1] = src[j] >> 4;
    }
    return buf;
  }
}

// One pass over a bag for output values [c0, c0 + N): acc stays in registers (N a constant).
template <int Bits, bool Fp32QParams, typename Index, int64_t N>
inline int64_t bag_chunk(const EmbeddingBagArgs<Index>& a, int64_t start, int64_t end, int64_t c0, int64_t n,
                         float* __restrict o) {
  constexpr int64_t qp_bytes = Fp32QParams ? 8 : 4;
  const int64_t len = N > 0 ? N : n;
  float acc[kChunk];
  for (int64_t d = 0; d < len; ++d) acc[d] = 0.f;
  alignas(64) uint8_t buf[kChunk];
  int64_t count = 0;
  for (int64_t i = start; i < end; ++i) {
    if (i + kPrefetch < end) {  // every cache line of the row kPrefetch ahead (rows are random in memory)
      const uint8_t* ahead = a.table + static_cast<int64_t>(a.indices[i + kPrefetch]) * a.row_bytes;
      for (int64_t l = 0; l < a.row_bytes; l += 64) __builtin_prefetch(ahead + l);
    }
    const int64_t idx = static_cast<int64_t>(a.indices[i]);
    if (idx == a.padding_idx) continue;
    ++count;
    const uint8_t* row = a.table + idx * a.row_bytes;  // [scale][bias][data]
    float scale, bias;
    qparams<Fp32QParams>(row, scale, bias);
    if (a.weights != nullptr) {
      scale *= a.weights[i];
      bias *= a.weights[i];
    }
    const uint8_t* __restrict q = levels<Bits>(row + qp_bytes, c0, len, buf);
    for (int64_t d = 0; d < len; ++d) acc[d] = std::fma(scale, static_cast<float>(q[d]), acc[d] + bias);
  }
  const float inv = a.mean && count > 0 ? 1.f / static_cast<float>(count) : 1.f;
  for (int64_t d = 0; d < len; ++d) o[c0 + d] = a.mean ? acc[d] * inv : acc[d];
  return count;
}

template <int Bits, bool Fp32QParams, typename Index>
void bag(const EmbeddingBagArgs<Index>& a, int64_t bag_begin, int64_t bag_end) {
  const int64_t dim = a.dim;
  for (int64_t b = bag_begin; b < bag_end; ++b) {
    float* __restrict o = a.out + b * dim;
    const int64_t start = static_cast<int64_t>(a.offsets[b]);
    const int64_t end = b + 1 < a.num_bags ? static_cast<int64_t>(a.offsets[b + 1]) : a.last_end;
    int64_t c0 = 0;
    for (; c0 + kChunk <= dim; c0 += kChunk) bag_chunk<Bits, Fp32QParams, Index, kChunk>(a, start, end, c0, kChunk, o);
    if (c0 < dim) bag_chunk<Bits, Fp32QParams, Index, 0>(a, start, end, c0, dim - c0, o);
  }
}

inline EmbeddingKernels make_embedding_kernels(const char* name) {
  return EmbeddingKernels{name,
                          {{bag<8, false, int32_t>, bag<8, true, int32_t>}, {bag<4, false, int32_t>, bag<4, true, int32_t>}},
                          {{bag<8, false, int64_t>, bag<8, true, int64_t>}, {bag<4, false, int64_t>, bag<4, true, int64_t>}}};
}

}  // namespace
}  // namespace qbackend::kernels
