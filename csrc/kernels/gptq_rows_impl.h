// The block step of gptq_kernels.h over groups of kLanes rows at once: the group's block of w and
// acc is transposed into lane-major buffers, so each column's chain (a division, the rounding, the
// error) runs for kLanes rows in vector registers and each error's update of the earlier columns
// is a broadcast product added to kLanes sums. The compiler vectorizes the lane loops for the unit's
// target (the including unit sets it: gptq_scalar.cpp, gptq_avx2.cpp, gptq_avx512.cpp); the
// arithmetic is the contract's, step for step, on each lane. The last group of fewer rows runs on
// padding (weight 0, scale 1) whose results are dropped.
//
// Nothing from the standard library is called here (std::min, std::vector...): an inline function
// instantiated in units built for different ISAs is one symbol to the linker, which may keep the
// widest unit's copy for all of them.
#pragma once
#include <cstdint>

namespace qbackend::kernels {
namespace {

template <int kLanes>
void round_block_groups(const float* w, const float* acc, int64_t ld, const float* l, int64_t ldl,
                        const float* scales, float* q, float* d, int64_t ldd, int64_t b, int64_t r0, int64_t r1,
                        float qmin, float qmax, float* scratch) {
  static_assert(kLanes <= kGptqMaxLanes);
  float* wt = scratch;          // [b][kLanes]: the group's weights
  float* at = wt + b * kLanes;  // [b][kLanes]: the sums a_j
  float* qt = at + b * kLanes;  // [b][kLanes]: the levels
  float dt[kLanes], s[kLanes];
  for (int64_t g = r0; g < r1; g += kLanes) {
    const int64_t rows = r1 - g < kLanes ? r1 - g : kLanes;
    for (int64_t r = 0; r < kLanes; ++r) s[r] = r < rows ? scales[g + r] : 1.0f;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t r = 0; r < kLanes; ++r) {
        wt[i * kLanes + r] = r < rows ? w[(g + r) * ld + i] : 0.0f;
        at[i * kLanes + r] = r < rows ? acc[(g + r) * ld + i] : 0.0f;
      }
    for (int64_t i = b - 1; i >= 0; --i) {
      const float* li = l + i * ldl;
      const float lii = li[i];
      float* wi = wt + i * kLanes;
      float* ai = at + i * kLanes;
      float* qi = qt + i * kLanes;
      for (int r = 0; r < kLanes; ++r) {
        const float shift = ai[r] / lii;
        const float y = wi[r] + shift;
        const float t = __builtin_nearbyintf(y / s[r]);
        const float low = t < qmin ? qmin : t;  // std::max(t, qmin)
        const float level = qmax < low ? qmax : low;  // std::min(low, qmax)
        qi[r] = level;
        const float prod = level * s[r];
        dt[r] = wi[r] - prod;
      }
      for (int64_t r = 0; r < rows; ++r) d[(g + r) * ldd + i] = dt[r];
      for (int64_t j = 0; j < i; ++j) {
        const float lij = li[j];
        float* aj = at + j * kLanes;
        for (int r = 0; r < kLanes; ++r) {
          const float t = dt[r] * lij;
          aj[r] = aj[r] + t;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < b; ++i) q[(g + r) * ld + i] = qt[i * kLanes + r];
  }
}

}  // namespace
}  // namespace qbackend::kernels
