// Per-token activations: qbackend::quantize_per_row and qbackend::per_row_dequantize, the two ops
// around an int8 GEMM whose float input is quantized per row (per token) at run time
// (qbackend.nn.TokenQuantizedLinear).
//
// quantize_per_row(x, qmax) -> (q, scale, zero_point): x float32 [..., K]; each row over its own
// range with qparams.choose_qparams' asymmetric rule (observers/qparams.py): lo = min(finite min,
// 0), hi = max(finite max, 0) in float64; lo == hi gives scale 1, zero point 0; else scale =
// max(float32((hi - lo) / qmax), FLT_EPSILON), zero_point = clamp(-round_half_even(lo / scale), 0,
// qmax). q = min(clamp(round_half_even(x / scale) + zero_point, 0, 255), qmax), the division in
// float32 (the quantize kernels' contract: NaN -> zero point, +inf -> qmax, -inf -> 0). q is uint8
// of x's shape, scale float32 and zero_point int32 of shape x.shape[:-1]. qmax: 255, or 127 where
// the GEMM's provider multiplies only 7-bit activations exactly.
//
// per_row_dequantize(acc, scale, zero_point, colsum, bias) -> y: acc float32 [..., N], the GEMM's
// output for q with input scale 1 and zero point 0 (sum_k q[m, k] w[n, k] times the weight's scale
// s_n); colsum [N] float32, (sum_k w[n, k]) s_n; y[m, n] = (acc[m, n] - float(zp[m]) * colsum[n])
// * scale[m] + bias[n] (no bias: + 0 left out), each operation one float32 rounding, in that order
// (no fused multiply-add: this unit is built for the baseline ISA). The reference of both:
// qbackend/ops/reference.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>
#include <optional>
#include <tuple>

#include "cpu/kernel_table.h"
#include "kernels/observer_kernels.h"
#include "kernels/quantize_kernels.h"
#include "runtime/activation_cache.h"

namespace qbackend::ops {
namespace {

const kernels::QuantizeKernels& quantize_table() {
  return cpu::kernel_table(&kernels::quantize_kernels_scalar, &kernels::quantize_kernels_avx2,
                           &kernels::quantize_kernels_avx512);
}

const kernels::ObserverKernels& observer_table() {
  return cpu::kernel_table(&kernels::observer_kernels_scalar, &kernels::observer_kernels_avx2,
                           &kernels::observer_kernels_avx512);
}

std::vector<int64_t> leading_sizes(const at::Tensor& x) {
  return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_row(const at::Tensor& x_in, int64_t qmax) {
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::ScalarType::Float, "quantize_per_row: x must be float32, got ",
                   x_in.scalar_type());
  TORCH_CHECK_VALUE(x_in.dim() >= 1, "quantize_per_row: x must have at least one dimension");
  TORCH_CHECK_VALUE(qmax == 255 || qmax == 127, "quantize_per_row: qmax must be 255 or 127, got ", qmax);
  const at::Tensor x = x_in.contiguous();
  const int64_t k = x.size(-1);
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  at::Tensor q = runtime::empty_output(x.sizes(), x.options().dtype(at::kByte));
  at::Tensor scale = at::empty(leading_sizes(x), x.options());
  at::Tensor zp = at::empty(leading_sizes(x), x.options().dtype(at::kInt));
  if (rows == 0) {
    if (k == 0) {
      scale.fill_(1.0);
      zp.zero_();
    }
    return {q, scale, zp};
  }
  const float* xp = x.const_data_ptr<float>();
  uint8_t* qp = q.mutable_data_ptr<uint8_t>();
  float* sp = scale.mutable_data_ptr<float>();
  int32_t* zpp = zp.mutable_data_ptr<int32_t>();
  const auto& qk = quantize_table();
  const auto& ok = observer_table();
  const int64_t grain = std::max<int64_t>(1, 16384 / k);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * k;
      kernels::FiniteStats st{INFINITY, -INFINITY, 0};
      ok.stats_f32(row, k, &st);
      const double lo = st.min <= st.max ? std::min<double>(st.min, 0.0) : 0.0;
      const double hi = st.min <= st.max ? std::max<double>(st.max, 0.0) : 0.0;
      float s = 1.0f;
      int32_t z = 0;
      if (lo != hi) {
        s = std::max(static_cast<float>((hi - lo) / static_cast<double>(qmax)), FLT_EPSILON);
        const double zd = -std::nearbyint(lo / static_cast<double>(s));
        z = static_cast<int32_t>(std::min<double>(std::max(zd, 0.0), static_cast<double>(qmax)));
      }
      sp[r] = s;
      zpp[r] = z;
      uint8_t* qrow = qp + r * k;
      qk.q_f32_u8(row, qrow, k, s, z);
      if (qmax < 255)
        for (int64_t i = 0; i < k; ++i) qrow[i] = std::min<uint8_t>(qrow[i], static_cast<uint8_t>(qmax));
    }
  });
  return {q, scale, zp};
}

at::Tensor per_row_dequantize(const at::Tensor& acc_in, const at::Tensor& scale_in, const at::Tensor& zp_in,
                              const at::Tensor& colsum_in, const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK_TYPE(acc_in.scalar_type() == at::ScalarType::Float, "per_row_dequantize: acc must be float32, got ",
                   acc_in.scalar_type());
  TORCH_CHECK_TYPE(scale_in.scalar_type() == at::ScalarType::Float, "per_row_dequantize: scale must be float32");
  TORCH_CHECK_TYPE(zp_in.scalar_type() == at::ScalarType::Int, "per_row_dequantize: zero_point must be int32");
  TORCH_CHECK_TYPE(colsum_in.scalar_type() == at::ScalarType::Float, "per_row_dequantize: colsum must be float32");
  TORCH_CHECK_VALUE(acc_in.dim() >= 1, "per_row_dequantize: acc must have at least one dimension");
  const int64_t n = acc_in.size(-1);
  const int64_t rows = n == 0 ? 0 : acc_in.numel() / n;
  TORCH_CHECK_VALUE(scale_in.numel() == rows && zp_in.numel() == rows,
                    "per_row_dequantize: scale and zero_point need one entry per row of acc (", rows, "), got ",
                    scale_in.numel(), " and ", zp_in.numel());
  TORCH_CHECK_VALUE(colsum_in.dim() == 1 && colsum_in.size(0) == n,
                    "per_row_dequantize: colsum must be 1-D of length acc.size(-1) = ", n);
  if (bias_in.has_value()) {
    TORCH_CHECK_TYPE(bias_in->scalar_type() == at::ScalarType::Float, "per_row_dequantize: bias must be float32");
    TORCH_CHECK_VALUE(bias_in->dim() == 1 && bias_in->size(0) == n,
                      "per_row_dequantize: bias must be 1-D of length acc.size(-1) = ", n);
  }
  const at::Tensor acc = acc_in.contiguous(), scale = scale_in.contiguous(), zp = zp_in.contiguous();
  const at::Tensor colsum = colsum_in.contiguous();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  at::Tensor y = runtime::empty_output(acc.sizes(), acc.options());
  if (rows == 0) return y;
  const float* ap = acc.const_data_ptr<float>();
  const float* sp = scale.const_data_ptr<float>();
  const int32_t* zpp = zp.const_data_ptr<int32_t>();
  const float* cp = colsum.const_data_ptr<float>();
  const float* bp = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / n);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float s = sp[r], z = static_cast<float>(zpp[r]);
      const float* a = ap + r * n;
      float* out = yp + r * n;
      if (bp != nullptr) {
        for (int64_t j = 0; j < n; ++j) {
          const float zc = z * cp[j];
          const float d = a[j] - zc;
          const float v = d * s;
          out[j] = v + bp[j];
        }
      } else {
        for (int64_t j = 0; j < n; ++j) {
          const float zc = z * cp[j];
          const float d = a[j] - zc;
          out[j] = d * s;
        }
      }
    }
  });
  return y;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("quantize_per_row(Tensor x, int qmax=255) -> (Tensor q, Tensor scale, Tensor zero_point)");
  m.def("per_row_dequantize(Tensor acc, Tensor scale, Tensor zero_point, Tensor colsum, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("quantize_per_row", &qbackend::ops::quantize_per_row);
  m.impl("per_row_dequantize", &qbackend::ops::per_row_dequantize);
}
