// The column loop of GPTQ weight rounding (qbackend/algorithms/gptq.py), the convert-time hot loop:
//
//   gptq_round_columns(w, u, scales, qmin, qmax, block) -> q
//       w: float32 [N, K], the weight with its columns in GPTQ's order; u: float32 [K, K], the
//       upper Cholesky factor of that order's (H + damping)^-1; scales: float32 [N] (> 0).
//       q: float32 [N, K] integer levels in [qmin, qmax], in w's column order.
//
// Column i of each block is rounded to its nearest level (ties to even, as torch.round), and its
// error e = (w_i - q_i s) / u_ii is taken off the block's columns j >= i as e * u_ij; after each
// block, the block's errors E go into the later columns as W[:, later] -= E @ U[block, later].
// Every step is the float32 operation (product, then difference: no fused multiply-add) that
// gptq.py's `gptq_columns_ref` performs, so the two agree bit for bit; rows are independent
// within a block, so the result does not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "common/checks.h"

namespace qbackend::ops {
namespace {

using at::Tensor;

// One block of columns [c0, c0 + b) for rows [r0, r1): wb row stride ldw, ub row stride ldu
// (pointing at u[c0, c0]), q and err written at column c0 / 0.
void round_block_rows(float* w, int64_t ldw, const float* u, int64_t ldu, const float* scales, float* q,
                      int64_t ldq, float* err, int64_t lde, int64_t b, int64_t r0, int64_t r1, float qmin,
                      float qmax) {
  for (int64_t r = r0; r < r1; ++r) {
    float* wr = w + r * ldw;
    float* qr = q + r * ldq;
    float* er = err + r * lde;
    const float s = scales[r];
    for (int64_t i = 0; i < b; ++i) {
      const float c = wr[i];
      const float level = std::min(std::max(std::nearbyint(c / s), qmin), qmax);
      qr[i] = level;
      const float prod = level * s;
      const float e = (c - prod) / u[i * ldu + i];
      er[i] = e;
      const float* ui = u + i * ldu;
      for (int64_t j = i; j < b; ++j) {
        const float t = e * ui[j];
        wr[j] = wr[j] - t;
      }
    }
  }
}

Tensor gptq_round_columns(const Tensor& w_in, const Tensor& u_in, const Tensor& scales_in, int64_t qmin,
                          int64_t qmax, int64_t block) {
  checks::dtype(w_in, at::kFloat, "w");
  checks::dtype(u_in, at::kFloat, "u");
  checks::dtype(scales_in, at::kFloat, "scales");
  TORCH_CHECK_VALUE(w_in.dim() == 2, "w must be 2-D [N, K], got ", w_in.dim(), "-D");
  const int64_t n = w_in.size(0), k = w_in.size(1);
  TORCH_CHECK_VALUE(u_in.dim() == 2 && u_in.size(0) == k && u_in.size(1) == k, "u must be [K, K] = [", k, ", ",
                    k, "], got ", u_in.sizes());
  TORCH_CHECK_VALUE(scales_in.numel() == n, "scales must hold N = ", n, " values, got ", scales_in.numel());
  TORCH_CHECK_VALUE(qmin <= qmax, "qmin must be <= qmax, got ", qmin, " > ", qmax);
  TORCH_CHECK_VALUE(block >= 1, "block must be >= 1, got ", block);
  Tensor w = w_in.contiguous().clone();
  const Tensor u = u_in.contiguous();
  const Tensor scales = scales_in.reshape({-1}).contiguous();
  Tensor q = at::empty({n, k}, w.options());
  if (n == 0 || k == 0) return q;
  const float* sp = scales.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const float lo = float(qmin), hi = float(qmax);
  for (int64_t c0 = 0; c0 < k; c0 += block) {
    const int64_t b = std::min(block, k - c0);
    Tensor err = at::empty({n, b}, w.options());
    float* ep = err.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, b * b / 8));
    at::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
      round_block_rows(wp + c0, k, up + c0 * k + c0, k, sp, qp + c0, k, ep, b, b, r0, r1, lo, hi);
    });
    if (c0 + b < k) {
      Tensor later = w.narrow(1, c0 + b, k - c0 - b);
      later.sub_(at::matmul(err, u.narrow(0, c0, b).narrow(1, c0 + b, k - c0 - b)));
    }
  }
  return q;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("gptq_round_columns(Tensor w, Tensor u, Tensor scales, int qmin, int qmax, int block) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("gptq_round_columns", &qbackend::ops::gptq_round_columns); }
