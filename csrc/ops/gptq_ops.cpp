// The column loop of GPTQ weight rounding (qbackend/algorithms/gptq.py), the convert-time hot loop:
//
//   gptq_round_columns(w, m, scales, qmin, qmax, block) -> q
//       w: float32 [N, K], the weight with its columns in GPTQ's order; m: float32 [K, K], upper
//       triangular with M M^T = that order's H + damping (only its upper triangle is read);
//       scales: float32 [N] (> 0).
//       q: float32 [N, K] integer levels in [qmin, qmax], in w's column order.
//
// Column j is rounded to the level nearest (ties to even, as torch.round) y_j = w_j + acc_j / m_jj,
// where acc_j = sum over the columns i < j of d_i m_ij and d_i = w_i - q_i s: inside a block each
// rounded column's d goes into the block's later columns at once; after the block, its D into the
// later blocks as ACC[:, later].addmm_(D, M[block, later]). Every step is the float32 operation
// (product, then sum: no fused multiply-add) that gptq.py's `gptq_columns_ref` performs, so the two
// agree bit for bit; rows are independent within a block, so the result does not depend on the
// thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "common/checks.h"

namespace qbackend::ops {
namespace {

using at::Tensor;

// One block of columns [c0, c0 + b) for rows [r0, r1): w, acc and q at column c0 with row stride
// ld, m pointing at m[c0, c0] with row stride ldm, d [rows, b] with row stride ldd.
void round_block_rows(const float* w, float* acc, int64_t ld, const float* m, int64_t ldm, const float* scales,
                      float* q, float* d, int64_t ldd, int64_t b, int64_t r0, int64_t r1, float qmin, float qmax) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* wr = w + r * ld;
    float* ar = acc + r * ld;
    float* qr = q + r * ld;
    float* dr = d + r * ldd;
    const float s = scales[r];
    for (int64_t i = 0; i < b; ++i) {
      const float* mi = m + i * ldm;
      const float shift = ar[i] / mi[i];
      const float y = wr[i] + shift;
      const float level = std::min(std::max(std::nearbyint(y / s), qmin), qmax);
      qr[i] = level;
      const float prod = level * s;
      const float di = wr[i] - prod;
      dr[i] = di;
      for (int64_t j = i + 1; j < b; ++j) {
        const float t = di * mi[j];
        ar[j] = ar[j] + t;
      }
    }
  }
}

Tensor gptq_round_columns(const Tensor& w_in, const Tensor& m_in, const Tensor& scales_in, int64_t qmin,
                          int64_t qmax, int64_t block) {
  checks::dtype(w_in, at::kFloat, "w");
  checks::dtype(m_in, at::kFloat, "m");
  checks::dtype(scales_in, at::kFloat, "scales");
  TORCH_CHECK_VALUE(w_in.dim() == 2, "w must be 2-D [N, K], got ", w_in.dim(), "-D");
  const int64_t n = w_in.size(0), k = w_in.size(1);
  TORCH_CHECK_VALUE(m_in.dim() == 2 && m_in.size(0) == k && m_in.size(1) == k, "m must be [K, K] = [", k, ", ",
                    k, "], got ", m_in.sizes());
  TORCH_CHECK_VALUE(scales_in.numel() == n, "scales must hold N = ", n, " values, got ", scales_in.numel());
  TORCH_CHECK_VALUE(qmin <= qmax, "qmin must be <= qmax, got ", qmin, " > ", qmax);
  TORCH_CHECK_VALUE(block >= 1, "block must be >= 1, got ", block);
  const Tensor w = w_in.contiguous();
  const Tensor m = m_in.contiguous();
  const Tensor scales = scales_in.reshape({-1}).contiguous();
  Tensor q = at::empty({n, k}, w.options());
  if (n == 0 || k == 0) return q;
  Tensor acc = at::zeros({n, k}, w.options());
  const float* sp = scales.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* ap = acc.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const float lo = float(qmin), hi = float(qmax);
  for (int64_t c0 = 0; c0 < k; c0 += block) {
    const int64_t b = std::min(block, k - c0);
    Tensor d = at::empty({n, b}, w.options());
    float* dp = d.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, b * b / 8));
    at::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
      round_block_rows(wp + c0, ap + c0, k, mp + c0 * k + c0, k, sp, qp + c0, dp, b, b, r0, r1, lo, hi);
    });
    if (c0 + b < k) {
      Tensor later = acc.narrow(1, c0 + b, k - c0 - b);
      later.addmm_(d, m.narrow(0, c0, b).narrow(1, c0 + b, k - c0 - b));
    }
  }
  return q;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("gptq_round_columns(Tensor w, Tensor m, Tensor scales, int qmin, int qmax, int block) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("gptq_round_columns", &qbackend::ops::gptq_round_columns); }
