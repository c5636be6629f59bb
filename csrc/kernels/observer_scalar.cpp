// Scalar (baseline x86-64) observer kernels: the fallback and the plainest statement of the
// contract in observer_kernels.h.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/observer_kernels.h"

namespace qbackend::kernels {
namespace {

constexpr float kFltMax = 3.40282346638528859812e+38f;

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) {
  const uint32_t bits = uint32_t(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bool finite(float v) { return std::fabs(v) <= kFltMax; }  // false for NaN and +-inf

template <typename In>
void stats(const In* x, int64_t n, FiniteStats* s) {
  float lo = s->min, hi = s->max;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_f32(x[i]);
    if (!finite(v)) {
      ++bad;
      continue;
    }
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  s->min = lo;
  s->max = hi;
  s->nonfinite += bad;
}

template <typename In>
void hist(const In* x, int64_t n, const HistWindow& w, uint16_t* counts, FiniteStats* s, int64_t* zeros) {
  const int64_t B = w.bins;
  float lo = s->min, hi = s->max;
  int64_t pos = 0, z = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_f32(x[i]);
    int64_t bin;
    if (!finite(v)) {
      bin = B;
    } else {
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      if (v == 0.0f) {
        ++z;
        continue;
      }
      const double t = std::floor(double(v) * w.inv_width) - w.offset;
      bin = (t >= 0.0 && t < double(B)) ? int64_t(t) : B + 1;
    }
    ++counts[bin * kHistCopies + pos++ % kHistCopies];
  }
  s->min = lo;
  s->max = hi;
  *zeros += z;
}

constexpr ObserverKernels kTable{"scalar", stats<float>, stats<uint16_t>, hist<float>, hist<uint16_t>};

}  // namespace

const ObserverKernels& observer_kernels_scalar() { return kTable; }

}  // namespace qbackend::kernels
