// The column loop of GPTQ weight rounding (qbackend/algorithms/gptq.py), the convert-time hot loop:
//
//   gptq_round_columns(w, l, scales, qmin, qmax, block) -> q
//       w: float32 [N, K], the weight with its columns in the order GPTQ rounds them REVERSED (the
//       last column is rounded first); l: float32 [K, K], lower triangular with L L^T = H + damping,
//       H in w's column order (only its lower triangle is read), any strides: what a Cholesky
//       factorization of that H gives (column-major), with no flip or copy; scales: float32 [N] (> 0).
//       q: float32 [N, K] integer levels in [qmin, qmax], in w's column order.
//
// Column j (from K - 1 down to 0) is rounded to the level nearest (ties to even, as torch.round)
// y_j = w_j + acc_j / l_jj, where acc_j = sum over the columns i > j of d_i l_ij and d_i = w_i - q_i s.
// In blocks of `block` columns from the last: inside a block each rounded column's d goes into the
// block's earlier columns at once (the per-ISA block step, kernels/gptq_kernels.h); after the
// block, its D into the earlier blocks as ACC[:, earlier].addmm_(D, L[block, earlier]). Every step
// is the float32 operation (product, then sum: no fused multiply-add) that gptq.py's
// `gptq_columns_ref` performs, so the two agree bit for bit; rows are independent, so the result
// does not depend on the thread count or the ISA.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/checks.h"
#include "cpu/kernel_table.h"
#include "kernels/gptq_kernels.h"

namespace qbackend::ops {
namespace {

using at::Tensor;

const kernels::GptqKernels& pick_kernels() {
  return cpu::kernel_table(&kernels::gptq_kernels_scalar, &kernels::gptq_kernels_avx2, &kernels::gptq_kernels_avx512);
}

Tensor gptq_round_columns(const Tensor& w_in, const Tensor& l_in, const Tensor& scales_in, int64_t qmin,
                          int64_t qmax, int64_t block) {
  checks::dtype(w_in, at::kFloat, "w");
  checks::dtype(l_in, at::kFloat, "l");
  checks::dtype(scales_in, at::kFloat, "scales");
  TORCH_CHECK_VALUE(w_in.dim() == 2, "w must be 2-D [N, K], got ", w_in.dim(), "-D");
  const int64_t n = w_in.size(0), k = w_in.size(1);
  TORCH_CHECK_VALUE(l_in.dim() == 2 && l_in.size(0) == k && l_in.size(1) == k, "l must be [K, K] = [", k, ", ",
                    k, "], got ", l_in.sizes());
  TORCH_CHECK_VALUE(scales_in.numel() == n, "scales must hold N = ", n, " values, got ", scales_in.numel());
  TORCH_CHECK_VALUE(qmin <= qmax, "qmin must be <= qmax, got ", qmin, " > ", qmax);
  TORCH_CHECK_VALUE(block >= 1, "block must be >= 1, got ", block);
  const Tensor w = w_in.contiguous();
  const Tensor& l = l_in;  // any strides (a Cholesky factor comes column-major): read by block
  const Tensor scales = scales_in.reshape({-1}).contiguous();
  Tensor q = at::empty({n, k}, w.options());
  if (n == 0 || k == 0) return q;
  Tensor acc = at::zeros({n, k}, w.options());
  const float* sp = scales.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* ap = acc.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const float lo = float(qmin), hi = float(qmax);
  const kernels::GptqKernels& kern = pick_kernels();
  for (int64_t c1 = k; c1 > 0;) {
    const int64_t c0 = std::max<int64_t>(0, c1 - block), b = c1 - c0;
    Tensor d = at::empty({n, b}, w.options());
    float* dp = d.data_ptr<float>();
    const Tensor diag_block = l.narrow(0, c0, b).narrow(1, c0, b).contiguous();  // row-major b x b
    const float* lp = diag_block.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(kernels::kGptqMaxLanes, 65536 / std::max<int64_t>(1, b * b));
    at::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
      std::vector<float> scratch(static_cast<size_t>(3 * b * kernels::kGptqMaxLanes));
      kern.round_block(wp + c0, ap + c0, k, lp, b, sp, qp + c0, dp, b, b, r0, r1, lo, hi,
                       scratch.data());
    });
    if (c0 > 0) acc.narrow(1, 0, c0).addmm_(d, l.narrow(0, c0, b).narrow(1, 0, c0));
    c1 = c0;
  }
  return q;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("gptq_round_columns(Tensor w, Tensor l, Tensor scales, int qmin, int qmax, int block) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("gptq_round_columns", &qbackend::ops::gptq_round_columns); }
