// A float16's bits (IEEE binary16: the embedding rows' fp16 scale and bias, the 4-bit weights' group
// scales and offsets) as float32, exactly (subnormals, infinities and NaN included): vcvtph2ps where the
// including unit's target has F16C, libgcc's conversion elsewhere. In an anonymous namespace: include it
// after the unit's QB_TARGET (if any), so each unit compiles its own copy for its own target.
#pragma once
#include <cstdint>
#include <cstring>

namespace qbackend::kernels {
namespace {

inline float half_to_float(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, sizeof f);
  return static_cast<float>(f);
}

}  // namespace
}  // namespace qbackend::kernels
