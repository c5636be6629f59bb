// torch ops qbackend::max_pool2d (max pooling of uint8 / int8 activations, channels-last) and
// qbackend::global_avg_pool2d (the mean over H x W of uint8 / int8 activations, requantized).
//
// Why our own: torch 2.13's aten max_pool2d refuses channels-last uint8/int8 tensors (an int32
// size check in its integer path fails for every size) and its NCHW integer path is scalar, several
// times slower than fp32 (benchmarks/results/design_measurements.md, "Integer max pooling"). Max commutes with the (monotonic) dequantize,
// so pooling the integers is exact: the lowering keeps pooled activations in int8.
//
// Semantics: those of aten max_pool2d (kernel, stride, padding, dilation, ceil_mode; padded
// positions never win). The output is channels-last. A row of output pixels at a time: on AVX2 the
// kernel in kernels/pool_avx2.cpp (each pixel's channels held in registers over its window), else
// a loop over channels (contiguous in channels-last) that the compiler vectorizes for the baseline
// ISA (pmaxub / pmaxsb).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/checks.h"
#include "cpu/probe.h"
#include "kernels/pool_kernels.h"
#include "runtime/activation_cache.h"
#include "runtime/parallel.h"

namespace qbackend::ops {
namespace {

int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  // floor division, as aten's: a window larger than the padded input gives a negative numerator
  const int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;  // the last window must start inside
  return out;
}

bool every_window_has_input(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
  for (int64_t o = 0; o < out; ++o) {
    bool any = false;
    for (int64_t i = 0; i < k && !any; ++i) {
      const int64_t pos = o * s - p + i * d;
      any = pos >= 0 && pos < in;
    }
    if (!any) return false;
  }
  return true;
}

std::array<int64_t, 2> pair(at::IntArrayRef v, const char* name, int64_t dflt) {
  TORCH_CHECK_VALUE(v.size() <= 2, name, " must have 1 or 2 elements, got ", v.size());
  if (v.empty()) return {dflt, dflt};
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

template <typename T>
void pool(const T* x, T* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW,
          std::array<int64_t, 2> k, std::array<int64_t, 2> s, std::array<int64_t, 2> p, std::array<int64_t, 2> d) {
  const bool avx2 = cpu::has(cpu::Isa::Avx2);
  parallel::parallel_for(0, N * OH, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, OW * C * k[0] * k[1] / 4)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / OH, oh = row % OH;
      if (avx2) {  // the window's rows inside the image: i in [i0, i1) on the dilation grid
        int64_t i0 = 0, i1 = k[0];
        while (oh * s[0] - p[0] + i0 * d[0] < 0) ++i0;
        while (oh * s[0] - p[0] + (i1 - 1) * d[0] >= H) --i1;
        const int64_t h0 = oh * s[0] - p[0] + i0 * d[0], h1 = oh * s[0] - p[0] + (i1 - 1) * d[0] + 1;
        kernels::max_pool_row_avx2(reinterpret_cast<const uint8_t*>(x + n * H * W * C),
                                   reinterpret_cast<uint8_t*>(y + (n * OH + oh) * OW * C), C, W, OW, h0, h1, d[0],
                                   k[1], s[1], p[1], d[1], std::is_same_v<T, int8_t>);
        continue;
      }
      for (int64_t ow = 0; ow < OW; ++ow) {
        T* __restrict out = y + ((n * OH + oh) * OW + ow) * C;
        std::fill(out, out + C, std::numeric_limits<T>::lowest());
        for (int64_t i = 0; i < k[0]; ++i) {
          const int64_t ih = oh * s[0] - p[0] + i * d[0];
          if (ih < 0 || ih >= H) continue;
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t iw = ow * s[1] - p[1] + j * d[1];
            if (iw < 0 || iw >= W) continue;
            const T* __restrict in = x + ((n * H + ih) * W + iw) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) out[c] = in[c] > out[c] ? in[c] : out[c];
          }
        }
      }
    }
  });
}

at::Tensor max_pool2d(const at::Tensor& x_in, at::IntArrayRef kernel_size, at::IntArrayRef stride_in,
                      at::IntArrayRef padding_in, at::IntArrayRef dilation_in, bool ceil_mode) {
  TORCH_CHECK_VALUE(x_in.device().is_cpu(), "x must be a CPU tensor, got a tensor on ", x_in.device());
  TORCH_CHECK_VALUE(x_in.scalar_type() == at::kByte || x_in.scalar_type() == at::kChar,
                    "x must be a uint8 or int8 tensor, got ", x_in.scalar_type());
  TORCH_CHECK_VALUE(x_in.dim() == 4, "x must be 4-D [N, C, H, W], got ", x_in.dim(), " dimensions");
  const auto k = pair(kernel_size, "kernel_size", 1);
  const auto s = stride_in.empty() ? k : pair(stride_in, "stride", 1);
  const auto p = pair(padding_in, "padding", 0);
  const auto d = pair(dilation_in, "dilation", 1);
  TORCH_CHECK_VALUE(k[0] > 0 && k[1] > 0 && s[0] > 0 && s[1] > 0 && d[0] > 0 && d[1] > 0,
                    "kernel_size, stride and dilation must be positive");
  TORCH_CHECK_VALUE(p[0] >= 0 && p[1] >= 0 && p[0] <= k[0] / 2 && p[1] <= k[1] / 2,
                    "padding must be non-negative and at most half the kernel size");
  const int64_t N = x_in.size(0), C = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  // aten's rule: only the batch may be empty
  TORCH_CHECK_VALUE(C > 0 && H > 0 && W > 0, "x must have non-empty channel and spatial dimensions (only the "
                    "batch may be 0), got shape ", x_in.sizes());
  const int64_t OH = pooled_size(H, k[0], p[0], s[0], d[0], ceil_mode);
  const int64_t OW = pooled_size(W, k[1], p[1], s[1], d[1], ceil_mode);
  TORCH_CHECK_VALUE(OH > 0 && OW > 0, "max_pool2d: the output would be empty: kernel_size ", k[0], "x", k[1],
                    " (dilation ", d[0], "x", d[1], ") is larger than the input ", H, "x", W, " plus padding ", p[0],
                    "x", p[1]);
  // A window over padding only has no integer maximum (aten's float pooling gives -inf there).
  TORCH_CHECK_VALUE(every_window_has_input(H, OH, k[0], s[0], p[0], d[0]) &&
                        every_window_has_input(W, OW, k[1], s[1], p[1], d[1]),
                    "max_pool2d: some pooling windows cover only padding (input ", H, "x", W, ", kernel ", k[0], "x",
                    k[1], ", dilation ", d[0], "x", d[1], ")");
  const at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor y = runtime::empty_output({N, C, OH, OW}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  if (x.scalar_type() == at::kByte)
    pool(x.data_ptr<uint8_t>(), y.data_ptr<uint8_t>(), N, C, H, W, OH, OW, k, s, p, d);
  else
    pool(x.data_ptr<int8_t>(), y.data_ptr<int8_t>(), N, C, H, W, OH, OW, k, s, p, d);
  return y;
}

// Global average pooling, int8 in and out: y[n][c] = clamp(round_half_even(m * (S[n][c] - H W x_zp)) +
// y_zp) with S the exact int32 sum over the H x W pixels and m = x_scale / (y_scale H W) in fp32
// (the difference is exact in fp32 below 2^24: H W <= 65536). Channels-last input: the sums run
// over contiguous channel rows (kernels/pool_avx2.cpp where the CPU has AVX2, else a loop the
// compiler vectorizes for the baseline ISA).
constexpr float kRoundMagic = 12582912.0f;  // 1.5 x 2^23

template <typename TX, typename TY>
void global_average(const TX* x, TY* y, int64_t N, int64_t C, int64_t HW, int32_t x_zp, float m, int32_t y_zp) {
  constexpr int32_t lo = std::numeric_limits<TY>::lowest(), hi = std::numeric_limits<TY>::max();
  const int32_t offset = static_cast<int32_t>(HW) * x_zp;
  const bool avx2 = cpu::has(cpu::Isa::Avx2);
  parallel::parallel_for(0, N, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, HW * C)), [&](int64_t b, int64_t e) {
    std::vector<int32_t> sum(static_cast<size_t>(C));
    for (int64_t n = b; n < e; ++n) {
      int32_t* __restrict s = sum.data();
      if (avx2) {
        kernels::channel_sums_avx2(reinterpret_cast<const uint8_t*>(x + n * HW * C), HW, C,
                                   std::is_same_v<TX, int8_t>, s);
      } else {
        std::fill(sum.begin(), sum.end(), 0);
        for (int64_t p = 0; p < HW; ++p) {
          const TX* __restrict in = x + (n * HW + p) * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) s[c] += in[c];
        }
      }
      TY* __restrict out = y + n * C;
      for (int64_t c = 0; c < C; ++c) {
        // Rounded half to even by adding and taking away 1.5 x 2^23 (exact below 2^22 in magnitude,
        // and vectorizable, where std::nearbyint is a library call per channel on the baseline ISA);
        // values beyond +-512 clamp to the same bound either way.
        const float t = std::min(512.0f, std::max(-512.0f, static_cast<float>(s[c] - offset) * m));
        const float v = ((t + kRoundMagic) - kRoundMagic) + static_cast<float>(y_zp);
        out[c] = static_cast<TY>(std::min<float>(hi, std::max<float>(lo, v)));
      }
    }
  });
}

at::Tensor global_avg_pool2d(const at::Tensor& x_in, double x_scale, int64_t x_zero_point, double output_scale,
                             int64_t output_zero_point, at::ScalarType output_dtype) {
  checks::activation(x_in, x_scale, x_zero_point);
  TORCH_CHECK_VALUE(x_in.dim() == 4, "x must be 4-D [N, C, H, W], got ", x_in.dim(), " dimensions");
  TORCH_CHECK_VALUE(checks::is_int8_type(output_dtype), "output_dtype must be uint8 or int8, got ",
                    checks::dtype_name(output_dtype));
  checks::scale(output_scale, "output_scale");
  checks::zero_point(output_zero_point, output_dtype, "output_zero_point");
  const auto xt = x_in.scalar_type();
  const int64_t N = x_in.size(0), C = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  TORCH_CHECK_VALUE(C > 0 && H > 0 && W > 0, "x must have non-empty channel and spatial dimensions (only the "
                    "batch may be 0), got shape ", x_in.sizes());
  TORCH_CHECK_VALUE(H * W <= 65536, "global_avg_pool2d takes up to 65536 pixels (H * W), got ", H, "x", W);
  const float m = static_cast<float>(x_scale / (output_scale * static_cast<double>(H * W)));
  TORCH_CHECK_VALUE(std::isfinite(m), "x_scale / (output_scale * H * W) must be finite, got ", x_scale, " / (",
                    output_scale, " * ", H * W, ")");
  const at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor y = at::empty({N, C, 1, 1}, x.options().dtype(output_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  if (N == 0) return y;
  const int32_t xzp = static_cast<int32_t>(x_zero_point), yzp = static_cast<int32_t>(output_zero_point);
  const auto run = [&](auto* xp) {
    if (output_dtype == at::kByte) global_average(xp, y.data_ptr<uint8_t>(), N, C, H * W, xzp, m, yzp);
    else global_average(xp, y.data_ptr<int8_t>(), N, C, H * W, xzp, m, yzp);
  };
  if (xt == at::kByte) run(x.const_data_ptr<uint8_t>());
  else run(x.const_data_ptr<int8_t>());
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("max_pool2d(Tensor x, int[] kernel_size, int[] stride=[], int[] padding=[0], int[] dilation=[1], "
        "bool ceil_mode=False) -> Tensor");
  m.def("global_avg_pool2d(Tensor x, float x_scale, int x_zero_point, float output_scale, int output_zero_point, "
        "ScalarType output_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("max_pool2d", max_pool2d);
  m.impl("global_avg_pool2d", global_avg_pool2d);
}

}  // namespace qbackend::ops
