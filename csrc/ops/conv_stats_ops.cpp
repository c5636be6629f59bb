// qbackend::im2col_column_sums(x, kernel, stride, padding, dilation) -> sums: per image, the sums
// over a conv's output positions of each im2col column ([N, C x KH x KW] float32, the order of
// weight.reshape(OC, -1): channel, kernel row, kernel column), without forming the im2col rows or
// the padded input. Column (c, i, j) at output position (oh, ow) reads channel c of the
// zero-padded input at (oh sh + i dh - ph, ow sw + j dw - pw); the padding adds nothing, so each
// column sums the input rows its kernel row reads (accumulated per input column) over the input
// columns its kernel column reads. One pass over each [H, W] plane (it stays in cache for its KH
// row sums), or for a channels-last x over each image's rows, a block of channels at a time (no
// layout copy); fp64 sums rounded once to float32, the same for either layout; NaN and inf
// propagate to the columns that read them.
//
// qbackend::sampled_im2col(x, kernel, stride, padding, dilation, step) -> rows: F.unfold's rows of x
// ([N x ceil(OH / step) x ceil(OW / step), C x KH x KW] float32, in F.unfold's column order) at
// every step-th output position in each direction (output rows 0, step, 2 step, ...; images, then
// rows, then columns), 0 where a tap reads the padding: only the rows taken are formed. x of any
// strides (channels-last read in place); one row per task, its taps copied channel by channel.
//
// The statistics of GPTQ / bias correction for convs (qbackend/algorithms/gptq.py); the references
// are the fp64 sum of F.unfold's rows and F.unfold's rows themselves (tests/algorithms/test_conv_gptq.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/checks.h"
#include "common/conv_params.h"

namespace qbackend::ops {
namespace {

// The output positions [lo, hi) among `count` whose input offset - pad + o stride lies inside
// [0, size), and the first one's input index (gptq.py's _tap_range).
struct TapRange {
  int64_t lo, hi, first;
};

TapRange tap_range(int64_t offset, int64_t pad, int64_t stride, int64_t count, int64_t size) {
  const int64_t need = pad - offset;  // o stride >= need
  int64_t lo = need <= 0 ? 0 : (need + stride - 1) / stride;
  const int64_t last = size - 1 - offset + pad;  // o stride <= last
  int64_t hi = last < 0 ? 0 : std::min(count, last / stride + 1);
  lo = std::min(lo, count);
  hi = std::max(hi, lo);
  return {lo, hi, offset - pad + lo * stride};
}

at::Tensor im2col_column_sums(const at::Tensor& x_in, at::IntArrayRef kernel, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation) {
  checks::dtype(x_in, at::kFloat, "x");
  TORCH_CHECK_VALUE(x_in.dim() == 4, "im2col_column_sums: x must be 4-D [N, C, H, W], got ", x_in.dim(), "-D");
  const auto [kh, kw] = pair_arg(kernel, "kernel", 1);
  const Conv2dParams p = conv2d_params(stride, padding, dilation, 1);
  const bool nhwc = !x_in.is_contiguous() && x_in.is_contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor x = nhwc ? x_in : x_in.contiguous();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const auto [oh, ow] = p.out_hw(h, w, kh, kw);
  at::Tensor sums = at::zeros({n, c * kh * kw}, x.options());
  if (n * c == 0 || oh == 0 || ow == 0) return sums;
  std::vector<TapRange> rows(kh), cols(kw);
  for (int64_t i = 0; i < kh; ++i) rows[i] = tap_range(i * p.dilation[0], p.padding[0], p.stride[0], oh, h);
  for (int64_t j = 0; j < kw; ++j) cols[j] = tap_range(j * p.dilation[1], p.padding[1], p.stride[1], ow, w);
  const float* xp = x.const_data_ptr<float>();
  float* sp = sums.mutable_data_ptr<float>();
  const int64_t sh = p.stride[0], sw = p.stride[1];
  if (nhwc) {  // channels last: per image and block of channels, the row sums are [W][channels]
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (c + kBlock - 1) / kBlock;
    at::parallel_for(0, n * blocks, 1, [&](int64_t t0, int64_t t1) {
      std::vector<double> acc(static_cast<size_t>(w * kBlock));
      double s[kBlock];
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t img = task / blocks, c0 = (task % blocks) * kBlock, cb = std::min(kBlock, c - c0);
        const float* image = xp + img * h * w * c;
        for (int64_t i = 0; i < kh; ++i) {
          const TapRange& r = rows[i];
          if (r.hi == r.lo) continue;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t t = 0; t < r.hi - r.lo; ++t) {
            const float* row = image + (r.first + t * sh) * w * c + c0;
            for (int64_t q = 0; q < w; ++q)
              for (int64_t k = 0; k < cb; ++k) acc[q * kBlock + k] += row[q * c + k];
          }
          for (int64_t j = 0; j < kw; ++j) {
            const TapRange& col = cols[j];
            std::fill(s, s + kBlock, 0.0);
            for (int64_t t = 0; t < col.hi - col.lo; ++t) {
              const double* a = acc.data() + (col.first + t * sw) * kBlock;
              for (int64_t k = 0; k < cb; ++k) s[k] += a[k];
            }
            float* out = sp + img * c * kh * kw + c0 * kh * kw + i * kw + j;
            for (int64_t k = 0; k < cb; ++k) out[k * kh * kw] = static_cast<float>(s[k]);
          }
        }
      }
    });
    return sums;
  }
  at::parallel_for(0, n * c, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, h * w)), [&](int64_t p0, int64_t p1) {
    std::vector<double> acc(static_cast<size_t>(w));
    for (int64_t p = p0; p < p1; ++p) {
      const float* plane = xp + p * h * w;
      float* out = sp + p * kh * kw;
      for (int64_t i = 0; i < kh; ++i) {
        const TapRange& r = rows[i];
        if (r.hi == r.lo) continue;  // every position reads the padding: 0
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t t = 0; t < r.hi - r.lo; ++t) {
          const float* row = plane + (r.first + t * sh) * w;
          for (int64_t q = 0; q < w; ++q) acc[q] += row[q];
        }
        for (int64_t j = 0; j < kw; ++j) {
          const TapRange& col = cols[j];
          double s = 0.0;
          for (int64_t t = 0; t < col.hi - col.lo; ++t) s += acc[col.first + t * sw];
          out[i * kw + j] = static_cast<float>(s);
        }
      }
    }
  });
  return sums;
}

at::Tensor sampled_im2col(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                          at::IntArrayRef dilation, int64_t step) {
  checks::dtype(x, at::kFloat, "x");
  TORCH_CHECK_VALUE(x.dim() == 4, "sampled_im2col: x must be 4-D [N, C, H, W], got ", x.dim(), "-D");
  TORCH_CHECK_VALUE(step >= 1, "sampled_im2col: step must be >= 1, got ", step);
  const auto [kh, kw] = pair_arg(kernel, "kernel", 1);
  const Conv2dParams p = conv2d_params(stride, padding, dilation, 1);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const auto [oh, ow] = p.out_hw(h, w, kh, kw);
  const int64_t rh = (oh + step - 1) / step, rw = (ow + step - 1) / step, k = c * kh * kw;
  at::Tensor rows = at::empty({n * rh * rw, k}, x.options());
  if (rows.numel() == 0) return rows;
  const float* xp = x.const_data_ptr<float>();
  float* out = rows.mutable_data_ptr<float>();
  const int64_t s_n = x.stride(0), s_c = x.stride(1), s_h = x.stride(2), s_w = x.stride(3);
  const int64_t dy = p.stride[0] * step, dx = p.stride[1] * step;
  at::parallel_for(0, n * rh * rw, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / (rh * rw), a = r / rw % rh, b = r % rw;
      float* row = out + r * k;
      for (int64_t i = 0; i < kh; ++i) {
        const int64_t y = a * dy + i * p.dilation[0] - p.padding[0];
        for (int64_t j = 0; j < kw; ++j) {
          const int64_t xx = b * dx + j * p.dilation[1] - p.padding[1];
          float* dst = row + i * kw + j;  // column (ch, i, j) at ch x kh x kw + i x kw + j
          if (y < 0 || y >= h || xx < 0 || xx >= w) {
            for (int64_t ch = 0; ch < c; ++ch) dst[ch * kh * kw] = 0.0f;
            continue;
          }
          const float* src = xp + img * s_n + y * s_h + xx * s_w;
          for (int64_t ch = 0; ch < c; ++ch) dst[ch * kh * kw] = src[ch * s_c];
        }
      }
    }
  });
  return rows;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("im2col_column_sums(Tensor x, int[2] kernel, int[2] stride, int[2] padding, int[2] dilation) -> Tensor");
  m.def("sampled_im2col(Tensor x, int[2] kernel, int[2] stride, int[2] padding, int[2] dilation, int step) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("im2col_column_sums", &qbackend::ops::im2col_column_sums);
  m.impl("sampled_im2col", &qbackend::ops::sampled_im2col);
}
