// Range choice over a power-of-two histogram: the error model and the greedy search (see the header).
#include "kernels/histogram_search.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace qbackend::kernels {

double PowerOfTwoHistogram::width() const { return std::ldexp(1.0, int(log2_width)); }
double PowerOfTwoHistogram::lower(int64_t j) const { return std::max(double(offset + j) * width(), min); }
double PowerOfTwoHistogram::upper(int64_t j) const { return std::min(double(offset + j + 1) * width(), max); }

namespace {

// Integral of t^2 over [a, b] (a <= b), factored so that nearby large a, b do not cancel.
inline double int_sq(double a, double b) { return (b - a) * (a * a + a * b + b * b) / 3.0; }

struct Quantizer {
  double c0, step;
  int64_t levels;

  int64_t cell(double x) const {  // index of the nearest level, clamped to the ends
    if (step <= 0.0) return 0;
    const double t = std::floor((x - c0) / step + 0.5);
    return int64_t(std::clamp(t, 0.0, double(levels - 1)));
  }
  double center(int64_t i) const { return c0 + double(i) * step; }

  // L2 error of mass n spread uniformly over [b, e] (a point mass if e <= b).
  double bin_error(double b, double e, double n) const {
    const int64_t ib = cell(b);
    if (!(e > b)) {
      const double d = b - center(ib);
      return n * d * d;
    }
    const int64_t ie = cell(e);
    double integral;
    if (ib == ie) {
      integral = int_sq(b - center(ib), e - center(ib));
    } else {  // the part in cell ib, the whole cells between, the part in cell ie
      const double h = step / 2.0;
      integral = int_sq(b - center(ib), h) + double(ie - ib - 1) * int_sq(-h, h) + int_sq(-h, e - center(ie));
    }
    return n / (e - b) * integral;
  }
};

double error_over(const OccupiedBins& bins, const Quantizer& q) {
  double err = 0.0;
  const size_t count = bins.n.size();
  for (size_t i = 0; i < count; ++i) err += q.bin_error(bins.lo[i], bins.hi[i], bins.n[i]);
  return err;
}

// First and last bins with mass; {0, -1} for an empty histogram.
std::pair<int64_t, int64_t> occupied(const PowerOfTwoHistogram& h) {
  int64_t j0 = 0, j1 = h.bins - 1;
  while (j0 < h.bins && h.counts[j0] == 0) ++j0;
  while (j1 >= 0 && h.counts[j1] == 0) --j1;
  return {j0, j1};
}

}  // namespace

OccupiedBins::OccupiedBins(const PowerOfTwoHistogram& h) {
  const auto [j0, j1] = occupied(h);
  for (int64_t j = j0; j <= j1; ++j)
    if (h.counts[j] != 0) {
      lo.push_back(h.lower(j));
      hi.push_back(h.upper(j));
      n.push_back(double(h.counts[j]));
    }
}

double quantization_error(const OccupiedBins& bins, double c0, double step, int64_t levels) {
  return error_over(bins, Quantizer{c0, step, levels});
}

std::pair<double, double> l2_range_search(const PowerOfTwoHistogram& h, int64_t levels) {
  const auto [j0, j1] = occupied(h);
  if (j1 <= j0) return {h.min, h.max};
  std::vector<double> cum(size_t(h.bins), 0.0);  // inclusive cumulative mass (exact below 2^53)
  double total = 0.0;
  for (int64_t j = j0; j <= j1; ++j) cum[size_t(j)] = total += double(h.counts[j]);

  const OccupiedBins bins(h);
  auto error_of = [&](int64_t s, int64_t e) {
    const double lo = h.lower(s), hi = h.upper(e);
    const double step = (hi - lo) / double(levels);
    return error_over(bins, Quantizer{lo + step / 2.0, step, levels});
  };

  constexpr double kStep = 1e-5;  // quantile granularity
  double alpha = 0.0, beta = 1.0;  // current lower / upper quantile bounds
  int64_t start = j0, end = j1;
  // p: first bin whose cumulative mass reaches alpha' * total; q: last bin whose cumulative mass is
  // at most beta' * total. Both only move inwards as alpha' grows and beta' shrinks.
  int64_t p = j0, q = j1;
  // torch.ao starts from +inf, so its first shrink is taken even when it is worse than the full
  // range (e.g. uniform data plus one far outlier: the first quantile step jumps past the top of
  // the data). Here the full range is the bar to beat: the result is never worse than [min, max].
  double best = error_of(start, end);
  while (alpha < beta) {
    const double next_alpha = alpha + kStep, next_beta = beta - kStep;
    while (p < j1 && cum[size_t(p)] < next_alpha * total) ++p;
    while (q > j0 && cum[size_t(q)] > next_beta * total) --q;
    const int64_t l = std::min(std::max(p, start), end);
    const int64_t r = std::max(std::min(q, end), start);
    int64_t next_start = start, next_end = end;
    if (l - start > end - r) {
      next_start = l;
      alpha = next_alpha;
    } else {
      next_end = r;
      beta = next_beta;
    }
    if (next_start == start && next_end == end) continue;
    const double err = error_of(next_start, next_end);
    if (err > best) break;
    best = err;
    start = next_start;
    end = next_end;
  }
  return {h.lower(start), h.upper(end)};
}

}  // namespace qbackend::kernels
