// Range choice over a power-of-two histogram (no torch headers; plain float64 C++).
//
// The histogram (see qbackend/observers/histogram.py): bin j counts the values x with
// floor(x * 2^-k) == offset + j, and the observed finite values lie in [min, max]. For the error
// model each bin's mass is spread uniformly over the bin clipped to [min, max], i.e. over
//   [max((offset + j) * 2^k, min), min((offset + j + 1) * 2^k, max)]
// (a point mass when that interval is empty, e.g. min == max).
//
// A uniform quantizer is given by its `levels` reconstruction values  c0 + i * step,
// i = 0 .. levels - 1; a value goes to the nearest one (values beyond either end go to the end
// one). Its error over the histogram is the integral of (x - q(x))^2 over the mass above, in closed
// form per bin (the cells a bin overlaps contribute the integral of x^2 over their overlap).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace qbackend::kernels {

struct PowerOfTwoHistogram {
  const int64_t* counts;
  int64_t bins;
  int64_t log2_width;
  int64_t offset;
  double min;  // observed finite min and max; the caller checks that the counts fit them
  double max;

  double width() const;
  double lower(int64_t j) const;  // bin j clipped to [min, max]
  double upper(int64_t j) const;
};

// The bins with mass, in order, as (lower edge, upper edge, mass): the edges clipped to [min, max]
// as lower(j) / upper(j) give them. Laid out once, then summed over for every quantizer.
struct OccupiedBins {
  std::vector<double> lo, hi, n;
  explicit OccupiedBins(const PowerOfTwoHistogram& h);
};

// Sum over the occupied bins, in order, of the L2 error of the quantizer (c0, step, levels); step >= 0
// (step == 0: every value goes to c0).
double quantization_error(const OccupiedBins& bins, double c0, double step, int64_t levels);

// The range [lo, hi] (lower edge of a start bin, upper edge of an end bin, clipped to [min, max])
// chosen by a greedy shrink from both ends, in the manner of torch.ao's HistogramObserver (after
// caffe2's NormMinimization): step the lower / upper quantile bound by 1e-5 of the mass, move the
// end whose quantile bin moved further, and stop as soon as the L2 error of quantizing the whole
// histogram with `levels` uniform cells over the candidate range (cell centers
// lo + (i + 0.5) * (hi - lo) / levels) grows. One deviation: the first candidate must beat the
// full range [min, max] (torch.ao accepts it unconditionally), so the result is never worse than
// min/max by this error. Returns {min, max} when nothing is cut.
std::pair<double, double> l2_range_search(const PowerOfTwoHistogram& h, int64_t levels);

}  // namespace qbackend::kernels
