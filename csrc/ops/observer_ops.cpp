// torch ops behind qbackend.observers: the one-pass statistics and the histogram hot loops
// (csrc/kernels/observer_*.cpp, chosen by cpu::kernel_table) and the range search /
// error model (csrc/kernels/histogram_search.cpp).
//
//   finite_minmax(x, axis=None) -> (min, max, nonfinite)
//       min/max of the finite values of x (float32 0-d tensors, or [C] along `axis`) and the number
//       of non-finite values (int64). +inf / -inf when there is no finite value; a zero is +0.0.
//   histogram_pow2(x, log2_width, offset, bins) -> (counts, min, max, nonfinite, outside)
//       counts[j] (int64 [bins]) = #finite x with floor(x * 2^-log2_width) == offset + j, and, from
//       the same pass, finite_minmax(x) and the number of finite values outside the window.
//   histogram_search_l2(counts, log2_width, offset, min, max, levels) -> float64 [2] (lo, hi)
//   histogram_quant_error(counts, log2_width, offset, min, max, first_center, step, levels)
//       -> float64 [n]: the L2 error of n uniform quantizers over the histogram.
//
// Inputs of any rank/strides (made contiguous), float32 or bfloat16; non-finite values are never
// binned (they are counted). Results are independent of the thread count and ISA.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "cpu/kernel_table.h"
#include "kernels/histogram_search.h"
#include "kernels/observer_kernels.h"
#include "common/checks.h"

namespace qbackend::ops {
namespace {

using at::Tensor;
using kernels::FiniteStats;
using kernels::HistWindow;
using kernels::ObserverKernels;

constexpr int64_t kGrain = 1 << 16;  // elements per at::parallel_for task (per-channel statistics)
constexpr int64_t kChunk = 1 << 16;  // elements per dynamically scheduled chunk
static_assert(kChunk <= kernels::kHistMaxN, "a chunk must fit the uint16 counters");
constexpr int64_t kMaxBins = int64_t(1) << 20;  // per-task partial counts stay a few MB
constexpr int64_t kMaxLog2Width = 300;            // 2^-k stays an exact, finite float64
constexpr int64_t kMaxOffset = int64_t(1) << 52;  // offset + bin stays exact in float64
constexpr int64_t kMaxLevels = int64_t(1) << 16;
constexpr float kInf = std::numeric_limits<float>::infinity();

const ObserverKernels& pick_kernels() {
  return cpu::kernel_table(&kernels::observer_kernels_scalar, &kernels::observer_kernels_avx2,
                           &kernels::observer_kernels_avx512);
}

FiniteStats empty_stats() { return FiniteStats{kInf, -kInf, 0}; }

// Runs body(local, begin, end) over chunks of [0, n), each thread of one at::parallel_for region
// into its own `local` (from make()), then merge(local) under a lock. Thread t first takes the
// chunks of the t-th contiguous share of [0, n), in order (the share torch's own parallel_for
// gives it, so the data an earlier op left in that core's caches is reused), then steals the
// chunks left in the other shares: a thread slowed down by another process on a shared machine
// leaves its remaining chunks to the others instead of holding everyone up at the end. Results
// must not depend on which thread handles which chunk.
template <typename Make, typename Body, typename Merge>
void chunked(int64_t n, int64_t chunk, Make make, Body body, Merge merge) {
  if (n <= 0) return;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  const int64_t nthreads = std::min<int64_t>(at::get_num_threads(), nchunks);
  struct alignas(64) Share {
    std::atomic<int64_t> next;
    int64_t end;
  };
  std::vector<Share> shares(static_cast<size_t>(nthreads));
  for (int64_t t = 0; t < nthreads; ++t) {
    shares[size_t(t)].next = nchunks * t / nthreads;
    shares[size_t(t)].end = nchunks * (t + 1) / nthreads;
  }
  std::mutex mu;
  at::parallel_for(0, nthreads, 1, [&](int64_t tb, int64_t te) {
    auto local = make();
    for (int64_t t = tb; t < te; ++t)  // one share per thread (all of them when not parallel)
      for (int64_t v = 0; v < nthreads; ++v) {  // own share first, then steal from the others
        Share& sh = shares[size_t((t + v) % nthreads)];
        for (int64_t c = sh.next.fetch_add(1); c < sh.end; c = sh.next.fetch_add(1))
          body(local, c * chunk, std::min(n, (c + 1) * chunk));
      }
    std::lock_guard<std::mutex> lock(mu);
    merge(local);
  });
}

void fold(FiniteStats& into, const FiniteStats& s) {
  into.min = s.min < into.min ? s.min : into.min;
  into.max = s.max > into.max ? s.max : into.max;
  into.nonfinite += s.nonfinite;
}

float plus_zero(float v) { return v + 0.0f; }  // -0.0 -> +0.0 (so the result does not depend on order)

void check_input(const Tensor& x) {
  checks::cpu(x, "x");
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "x must be a float32 or bfloat16 tensor, got ", checks::dtype_name(x.scalar_type()));
}

Tensor contiguous_input(const Tensor& x) {
  check_input(x);
  return x.contiguous();
}

// The values of x in memory order, for statistics that do not depend on the order: a dense tensor
// in any dim order (channels-last activations) is read where it lies, as a flat view of its
// memory, instead of being copied into contiguous order.
Tensor flat_input(const Tensor& x) {
  check_input(x);
  if (x.is_contiguous() || !x.is_non_overlapping_and_dense()) return x.contiguous().reshape({-1});
  return x.as_strided({x.numel()}, {1}, x.storage_offset());
}

const uint16_t* bf16_ptr(const Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}

// stats over x[b, e) with the typed kernel
void stats_range(const ObserverKernels& k, const Tensor& x, int64_t b, int64_t e, FiniteStats* s) {
  if (x.scalar_type() == at::kFloat) k.stats_f32(x.const_data_ptr<float>() + b, e - b, s);
  else k.stats_bf16(bf16_ptr(x) + b, e - b, s);
}

Tensor scalar_f32(float v) { return at::scalar_tensor(v, at::dtype(at::kFloat)); }
Tensor scalar_i64(int64_t v) { return at::scalar_tensor(v, at::dtype(at::kLong)); }

std::tuple<Tensor, Tensor, Tensor> minmax_per_tensor(const Tensor& x) {
  const auto& k = pick_kernels();
  FiniteStats total = empty_stats();
  chunked(
      x.numel(), kChunk, [] { return empty_stats(); },
      [&](FiniteStats& s, int64_t b, int64_t e) { stats_range(k, x, b, e, &s); },
      [&](const FiniteStats& s) { fold(total, s); });
  return {scalar_f32(plus_zero(total.min)), scalar_f32(plus_zero(total.max)), scalar_i64(total.nonfinite)};
}

// x viewed as [outer, C, inner]: per-channel statistics.
std::tuple<Tensor, Tensor, Tensor> minmax_per_channel(const Tensor& x, int64_t axis) {
  const int64_t d = x.dim();
  TORCH_CHECK_VALUE(d >= 1, "axis cannot index a 0-d x: per-channel statistics need at least 1 dimension");
  TORCH_CHECK_VALUE(axis >= -d && axis < d, "axis must be in [", -d, ", ", d, ") for x with ", d,
                    " dimensions, got ", axis);
  if (axis < 0) axis += d;
  const int64_t C = x.size(axis);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.size(i);
  for (int64_t i = axis + 1; i < d; ++i) inner *= x.size(i);
  std::vector<FiniteStats> st(size_t(C), empty_stats());
  if (x.numel() > 0) {
    const auto& k = pick_kernels();
    if (inner >= 16) {  // runs of one channel: vector kernel per run, channels split over threads
      at::parallel_for(0, C, std::max<int64_t>(1, kGrain / (outer * inner)), [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c)
          for (int64_t o = 0; o < outer; ++o) {
            const int64_t base = (o * C + c) * inner;
            stats_range(k, x, base, base + inner, &st[size_t(c)]);
          }
      });
    } else {  // short runs: rows of C * inner split over threads, partial per-channel stats merged
      std::mutex mu;
      at::parallel_for(0, outer, std::max<int64_t>(1, kGrain / (C * inner)), [&](int64_t ob, int64_t oe) {
        std::vector<FiniteStats> part(size_t(C), empty_stats());
        for (int64_t o = ob; o < oe; ++o)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t base = (o * C + c) * inner;
            stats_range(k, x, base, base + inner, &part[size_t(c)]);
          }
        std::lock_guard<std::mutex> lock(mu);
        for (int64_t c = 0; c < C; ++c) fold(st[size_t(c)], part[size_t(c)]);
      });
    }
  }
  Tensor mn = at::empty({C}, at::dtype(at::kFloat)), mx = at::empty({C}, at::dtype(at::kFloat));
  Tensor nf = at::empty({C}, at::dtype(at::kLong));
  for (int64_t c = 0; c < C; ++c) {
    mn.mutable_data_ptr<float>()[c] = plus_zero(st[size_t(c)].min);
    mx.mutable_data_ptr<float>()[c] = plus_zero(st[size_t(c)].max);
    nf.mutable_data_ptr<int64_t>()[c] = st[size_t(c)].nonfinite;
  }
  return {mn, mx, nf};
}

std::tuple<Tensor, Tensor, Tensor> finite_minmax(const Tensor& x_in, std::optional<int64_t> axis) {
  if (axis.has_value()) return minmax_per_channel(contiguous_input(x_in), *axis);
  return minmax_per_tensor(flat_input(x_in));
}

void check_window(int64_t log2_width, int64_t offset, int64_t bins) {
  TORCH_CHECK_VALUE(log2_width >= -kMaxLog2Width && log2_width <= kMaxLog2Width, "log2_width must be in [",
                    -kMaxLog2Width, ", ", kMaxLog2Width, "], got ", log2_width);
  TORCH_CHECK_VALUE(bins >= 1 && bins <= kMaxBins, "bins must be in [1, ", kMaxBins, "], got ", bins);
  TORCH_CHECK_VALUE(offset >= -kMaxOffset && offset <= kMaxOffset - bins, "offset must be in [", -kMaxOffset,
                    ", 2^52 - bins], got ", offset);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> histogram_pow2(const Tensor& x_in, int64_t log2_width,
                                                                  int64_t offset, int64_t bins) {
  const Tensor x = flat_input(x_in);
  check_window(log2_width, offset, bins);
  const HistWindow w{std::ldexp(1.0, -int(log2_width)), double(offset), int32_t(bins)};
  const int64_t stride = bins + 2;
  std::vector<int64_t> total(size_t(stride), 0);
  FiniteStats st = empty_stats();
  const auto& k = pick_kernels();
  // One thread's partial histogram: uint16 counters (kHistCopies interleaved rows per bin),
  // flushed into int64 before they could overflow, not per chunk (chunks are small for balance).
  struct Local {
    std::vector<uint16_t> rows;
    std::vector<int64_t> part;
    int64_t bound = 0;  // most increments any entry can have had since the last flush (<= 65535)
    FiniteStats s;
    int64_t zeros = 0;
    void flush() {
      constexpr int R = kernels::kHistCopies;
      for (size_t j = 0; j < part.size(); ++j) {
        int64_t sum = 0;
        for (int r = 0; r < R; ++r) sum += rows[j * R + size_t(r)];
        part[j] += sum;
      }
      std::fill(rows.begin(), rows.end(), uint16_t(0));
      bound = 0;
    }
  };
  chunked(
      x.numel(), kChunk,
      [&] {
        return Local{std::vector<uint16_t>(size_t(kernels::kHistCopies * stride)), std::vector<int64_t>(size_t(stride)),
                     0, empty_stats()};
      },
      [&](Local& l, int64_t b, int64_t e) {
        const int64_t add = (e - b + kernels::kHistCopies - 1) / kernels::kHistCopies + 1;  // per the contract
        if (l.bound + add > 65535) l.flush();
        l.bound += add;
        if (x.scalar_type() == at::kFloat) k.hist_f32(x.const_data_ptr<float>() + b, e - b, w, l.rows.data(), &l.s, &l.zeros);
        else k.hist_bf16(bf16_ptr(x) + b, e - b, w, l.rows.data(), &l.s, &l.zeros);
      },
      [&](Local& l) {
        l.flush();
        // exact zeros go to the bin of 0 (floor(0 * 2^-k) = 0, i.e. bin -offset) if the window has it
        l.part[size_t(offset <= 0 && -offset < bins ? -offset : bins + 1)] += l.zeros;
        fold(st, l.s);
        for (int64_t j = 0; j < stride; ++j) total[size_t(j)] += l.part[size_t(j)];
      });
  Tensor counts = at::empty({bins}, at::dtype(at::kLong));
  std::copy(total.begin(), total.begin() + bins, counts.mutable_data_ptr<int64_t>());
  return {counts, scalar_f32(plus_zero(st.min)), scalar_f32(plus_zero(st.max)), scalar_i64(total[size_t(bins)]),
          scalar_i64(total[size_t(bins + 1)])};
}

// Validates a histogram (counts, window, observed range) and returns a view of it.
kernels::PowerOfTwoHistogram checked_histogram(const Tensor& counts, int64_t log2_width, int64_t offset,
                                               double min, double max) {
  checks::dtype(counts, at::kLong, "counts");
  TORCH_CHECK_VALUE(counts.dim() == 1 && counts.numel() >= 1, "counts must be 1-D and non-empty, got shape ",
                    counts.sizes());
  TORCH_CHECK_VALUE(counts.is_contiguous(), "counts must be contiguous");
  const int64_t bins = counts.numel();
  check_window(log2_width, offset, bins);
  TORCH_CHECK_VALUE(std::isfinite(min) && std::isfinite(max) && min <= max,
                    "min and max must be finite with min <= max, got min = ", min, ", max = ", max);
  const kernels::PowerOfTwoHistogram h{counts.const_data_ptr<int64_t>(), bins, log2_width, offset, min, max};
  const double inv = std::ldexp(1.0, -int(log2_width));
  const double jmin = std::floor(min * inv) - double(offset), jmax = std::floor(max * inv) - double(offset);
  TORCH_CHECK_VALUE(jmin >= 0 && jmax < double(bins), "[min, max] = [", min, ", ", max,
                    "] does not fit the window of ", bins, " bins of width 2^", log2_width, " from bin ", offset);
  double total = 0.0;
  for (int64_t j = 0; j < bins; ++j) {
    const int64_t c = h.counts[j];
    TORCH_CHECK_VALUE(c >= 0, "counts must be non-negative, got counts[", j, "] = ", c);
    TORCH_CHECK_VALUE(c == 0 || (double(j) >= jmin && double(j) <= jmax), "counts[", j, "] = ", c,
                      " lies outside [min, max] = [", min, ", ", max, "] (bins ", int64_t(jmin), " to ",
                      int64_t(jmax), ")");
    total += double(c);
  }
  TORCH_CHECK_VALUE(total > 0.0, "counts must not be all zero (an empty histogram has no range)");
  return h;
}

void check_levels(int64_t levels) {
  TORCH_CHECK_VALUE(levels >= 2 && levels <= kMaxLevels, "levels must be in [2, ", kMaxLevels, "], got ", levels);
}

Tensor histogram_search_l2(const Tensor& counts_in, int64_t log2_width, int64_t offset, double min, double max,
                           int64_t levels) {
  check_levels(levels);
  const Tensor counts = counts_in.contiguous();
  const auto h = checked_histogram(counts, log2_width, offset, min, max);
  const auto [lo, hi] = kernels::l2_range_search(h, levels);
  Tensor out = at::empty({2}, at::dtype(at::kDouble));
  out.mutable_data_ptr<double>()[0] = lo;
  out.mutable_data_ptr<double>()[1] = hi;
  return out;
}

Tensor histogram_quant_error(const Tensor& counts_in, int64_t log2_width, int64_t offset, double min, double max,
                             const Tensor& first_center, const Tensor& step, int64_t levels) {
  check_levels(levels);
  const Tensor counts = counts_in.contiguous();
  const auto h = checked_histogram(counts, log2_width, offset, min, max);
  checks::dtype(first_center, at::kDouble, "first_center");
  checks::dtype(step, at::kDouble, "step");
  TORCH_CHECK_VALUE(first_center.dim() == 1 && step.dim() == 1 && first_center.numel() == step.numel(),
                    "first_center and step must be 1-D of one length, got shapes ", first_center.sizes(), " and ",
                    step.sizes());
  const Tensor c0 = first_center.contiguous(), st = step.contiguous();
  const int64_t n = c0.numel();
  const double* cp = c0.const_data_ptr<double>();
  const double* sp = st.const_data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(std::isfinite(cp[i]), "first_center must be finite, got first_center[", i, "] = ", cp[i]);
    TORCH_CHECK_VALUE(std::isfinite(sp[i]) && sp[i] >= 0.0, "step must be finite and >= 0, got step[", i,
                      "] = ", sp[i]);
  }
  Tensor out = at::empty({n}, at::dtype(at::kDouble));
  double* op = out.mutable_data_ptr<double>();
  const kernels::OccupiedBins bins(h);
  at::parallel_for(0, n, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) op[i] = kernels::quantization_error(bins, cp[i], sp[i], levels);
  });
  return out;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("finite_minmax(Tensor x, int? axis=None) -> (Tensor min, Tensor max, Tensor nonfinite)");
  m.def("histogram_pow2(Tensor x, int log2_width, int offset, int bins) -> "
        "(Tensor counts, Tensor min, Tensor max, Tensor nonfinite, Tensor outside)");
  m.def("histogram_search_l2(Tensor counts, int log2_width, int offset, float min, float max, int levels) -> Tensor");
  m.def("histogram_quant_error(Tensor counts, int log2_width, int offset, float min, float max, "
        "Tensor first_center, Tensor step, int levels) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("finite_minmax", &qbackend::ops::finite_minmax);
  m.impl("histogram_pow2", &qbackend::ops::histogram_pow2);
  m.impl("histogram_search_l2", &qbackend::ops::histogram_search_l2);
  m.impl("histogram_quant_error", &qbackend::ops::histogram_quant_error);
}
