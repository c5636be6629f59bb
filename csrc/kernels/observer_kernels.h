// Raw observer kernels (no torch headers): one table of function pointers per ISA.
//
// Contract, for every ISA (values are float32, or bf16 passed as uint16_t bits and widened exactly
// to float32; pointers need no alignment). How the counts are spread over the rows and whether
// zeros go to *zeros may differ between ISAs; the sums the caller forms are the same bit for bit.
//
//   stats:  over n contiguous values, the min and max of the finite ones and the number of
//           non-finite ones (NaN, +inf, -inf). Folds into *s: s->min = min(s->min, ...), likewise
//           max, s->nonfinite += count. An empty or all-non-finite input leaves min/max alone
//           (start them at +inf / -inf). The sign of a zero min/max is unspecified (the torch op
//           returns +0.0).
//
//   hist:   the same min/max fold (s->nonfinite is NOT touched), and a histogram of power-of-two
//           bins: value x falls in bin  i = floor(x * 2^-k) - offset,  the product an exact
//           float64 product (a power-of-two scaling of a float32 is exact in float64). With
//           B = w.bins, `counts` has (B + 2) * kHistCopies uint16 entries, kHistCopies per bin
//           (entry i * kHistCopies + r: row r of bin i); the kernel adds 1 to one row of
//             bin i        for finite x with 0 <= i < B,
//             bin B        for non-finite x,
//             bin B + 1    for finite x outside the window (i < 0 or i >= B),
//           spreading consecutive values over the rows so that no entry gets more than
//           ceil(n / kHistCopies) + 1, except that exact zeros (+0.0, -0.0) may instead be
//           counted in *zeros (activations after a ReLU are half zeros; a vector compare counts
//           them faster than bumping one counter). The caller adds *zeros to bin -offset (or to
//           the outside count), sums the rows, and keeps n <= kHistMaxN per call, so no entry
//           overflows.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

// Running min/max of the finite values (start at +inf / -inf) and count of non-finite values.
struct FiniteStats {
  float min;
  float max;
  int64_t nonfinite;
};

// The histogram window: bins [offset, offset + bins) of width 2^k, given as inv_width = 2^-k.
struct HistWindow {
  double inv_width;  // 2^-k, exact
  double offset;     // integer valued, |offset| <= 2^52
  int32_t bins;      // >= 1
};

// Rows of partial counts per bin (consecutive increments go to different rows, so repeated hits
// of one bin do not serialise on one memory location).
constexpr int kHistCopies = 8;
constexpr int64_t kHistMaxN = int64_t(kHistCopies) * 65534;

struct ObserverKernels {
  const char* name;  // "avx512", "avx2", "scalar"
  void (*stats_f32)(const float* x, int64_t n, FiniteStats* s);
  void (*stats_bf16)(const uint16_t* x, int64_t n, FiniteStats* s);
  void (*hist_f32)(const float* x, int64_t n, const HistWindow& w, uint16_t* counts, FiniteStats* s,
                   int64_t* zeros);
  void (*hist_bf16)(const uint16_t* x, int64_t n, const HistWindow& w, uint16_t* counts, FiniteStats* s,
                    int64_t* zeros);
};

// Each is defined in its own translation unit (observer_<isa>.cpp). Only call the AVX ones when
// qbackend::cpu::has(Isa::Avx512) resp. has(Isa::Avx2).
const ObserverKernels& observer_kernels_avx512();
const ObserverKernels& observer_kernels_avx2();
const ObserverKernels& observer_kernels_scalar();

}  // namespace qbackend::kernels
