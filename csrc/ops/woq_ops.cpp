// The weight-only Linear ops (qbackend.nn.WeightOnlyLinear, Int4WeightOnlyLinear, qbackend.quantize_llm):
//
//   woq_linear(x, w, scales, bias=None) -> y
//       y = x @ (float(W) * scales[:, None])^T + bias, x float32 [..., K], W int8 [N, K] (one scale
//       per output channel) given as its row tiles w, scales float32 [N], bias float32 [N] or None;
//       y float32 [..., N].
//   woq4_linear(x, w, scales, offsets, group_size, in_features, out_features, bias=None) -> y
//       y = x @ W^T + bias with W[n, k] = S[n, g] * u(n, k) + O[n, g], g = k / group_size: 4-bit weights
//       u packed two to a byte (U uint8 [N, ceil(K / 2)], k even in the low nibble) given as its row
//       tiles w, the group scales S and offsets O (float16 [N, ceil(K / group_size)], each converted to
//       float32 exactly) as their group tiles scales and offsets; group_size a multiple of 16,
//       K = in_features, N = out_features.
//   woq_a8_linear(x, w, scales, bias=None) -> y
//       woq_linear's int8 weights against x quantized to int8 by blocks of 32 k (as below): W8A8, the
//       products u8 x s8 (VNNI) or 16-bit (AVX2) in int32.
//   woq4a8_linear(x, w, scales, offsets, group_size, in_features, out_features, bias=None) -> y
//       the same int4 weights (group_size a power of two) against x quantized to int8 by blocks of 32 k
//       (each block's scale max |x| / 127, values rounded half to even): y = xq_dequantized @ W^T + bias,
//       the products u8 x s8 in int32 (csrc/kernels/woq_a8_*.cpp, W4A8, the form of llama.cpp's
//       Q4 x Q8 dot products); a block with a NaN or infinity makes its row's outputs NaN.
//
// Row tiles (kernels::WeightTiles, woq_kernels.h; made by qbackend.nn.weight_tiles.tile_rows): a weight
// of N rows of B bytes as [ceil(N / 4), ceil(B / 16), 64], the rows in groups of four, each group as
// 16-byte chunks of its four rows in turn, zero-padded (for int8 weights N is the length of scales).
// Group tiles (WeightTiles::group_at; qbackend.nn.weight_tiles.tile_groups): per-group values [N, G] as
// [ceil(N / 4), G, 4], the four rows of a tile side by side for each group.
//
// Up to a few rows of x with float activations (kGemvMaxRows, kGemv4MaxRows), and up to kGemvA8MaxRows
// (kGemv4A8MaxRows for int4 weights) with int8 activations (decoding, prompts): csrc/kernels/woq_*.cpp on
// blocks of output channels of about kBlockBytes of weights, each block read from memory once and reused
// from the cache by every four rows of x (the weights are never stored in float). More rows: the weights dequantized block by block
// (kPanelRows output channels) into a float32 panel that at::mm multiplies. Both accumulate in float32
// (woq_kernels.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "common/checks.h"
#include "cpu/kernel_table.h"
#include "kernels/woq_a8_kernels.h"
#include "kernels/woq_kernels.h"
#include "ops/woq_ops.h"

namespace qbackend::ops {
namespace {

using at::Tensor;

// Where the kernels' time per row of x (flat in M: they convert every weight for every four rows) meets
// a dequantized panel's (the panel's conversion shared by all rows, then MKL's float32 GEMM), measured on
// Zen 4 at 2 threads on SmolLM2's 1536 x 576, us a row:
//   int8 weights, float x: the kernel 22 at any M; the panel 27.9 at 16 rows, 18.4 at 32, 13.9 at 64.
//   int4 weights, float x: the kernel 16.6-17.4 at 8 to 64 rows; the panel 12.0 at 128.
//   int8 activations (VNNI): the kernels 8.3-9.8 (int8 weights) and 11.1-13 (int4) at every M up to 512,
//   the panels 13.5 and 12.9 at 512 rows; on a 1024-wide Llama's 2816 x 1024, 22 and 35 against 38 and 37.
constexpr int64_t kGemvMaxRows = 24;
constexpr int64_t kGemv4MaxRows = 64;
constexpr int64_t kGemvA8MaxRows = 1024;
// int4 weights against int8 activations: the kernel's cost per row is flat (13.4-14.9 us on SmolLM2's
// shapes on an Intel Xeon with AMX, 2 threads) where the panels' falls with M (a fixed 0.6-0.66 ms for the
// conversion, then 7.3-9.2 us a row there: 1.6-1.75x faster at 512 rows); on Zen 4 the panels are 0-16%
// slower at 512 rows (above). Prompts of 512 rows and more take the panels.
constexpr int64_t kGemv4A8MaxRows = 511;
// Weight bytes per call of the kernel: a block of channels the rows of x reuse from the cache.
constexpr int64_t kBlockBytes = 32 << 10;
constexpr int64_t kPanelRows = 512;

const kernels::WoqKernels& woq_kernels() {
  return cpu::kernel_table(&kernels::woq_kernels_scalar, &kernels::woq_kernels_avx2, &kernels::woq_kernels_avx512);
}

// The int8-activation kernels (W4A8, W8A8) need exact u8 x s8 dot products: AVX512-VNNI, else AVX2's 16-bit
// products, else scalar.
const kernels::WoqA8Kernels& woq_a8_kernels() {
  if (cpu::has(cpu::Isa::Avx512Vnni)) return kernels::woq_a8_kernels_avx512_vnni();
  if (cpu::has(cpu::Isa::Avx2)) return kernels::woq_a8_kernels_avx2();
  return kernels::woq_a8_kernels_scalar();
}

// The optional bias as float32 [N] (undefined when None), checked.
Tensor checked_bias(const std::optional<Tensor>& bias_in, int64_t N) {
  if (!bias_in.has_value() || !bias_in->defined()) return Tensor();
  checks::dtype(*bias_in, at::kFloat, "bias");
  TORCH_CHECK_VALUE(bias_in->numel() == N, "bias must hold ", N, " values, got ", bias_in->numel());
  return bias_in->dim() == 1 && bias_in->is_contiguous() ? *bias_in : bias_in->reshape({-1}).contiguous();
}

// x [..., K] with its M rows contiguous (x itself where it is, so a decode step makes no view), and the
// shape of y [..., N].
struct Rows {
  Tensor x;
  int64_t M;
  std::vector<int64_t> out_shape;
  const float* data() const { return x.data_ptr<float>(); }
  Tensor matrix(int64_t K) const { return x.view({M, K}); }  // [M, K], for the panels
};

Rows as_rows(const Tensor& x, int64_t K, int64_t N) {
  Rows r{Tensor(), 1, std::vector<int64_t>(x.sizes().begin(), x.sizes().end())};
  r.out_shape.back() = N;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) r.M *= x.size(d);
  r.x = x.is_contiguous() ? x : x.reshape({r.M, K}).contiguous();
  return r;
}

// Runs kernel(n0, n1) over the output channels [0, N) in blocks of about kBlockBytes of weights
// (row_bytes per channel) and a multiple of `multiple` channels (4: a row tile; W8A8 with several passes
// of rows takes 16, the four row tiles its VNNI kernel takes a pass, even where long rows make that more
// than kBlockBytes), the blocks shared out among the threads.
template <typename Kernel>
void by_channel_blocks(int64_t N, int64_t row_bytes, const Kernel& kernel, int64_t multiple = 4) {
  const int64_t block =
      std::max<int64_t>(multiple, kBlockBytes / std::max<int64_t>(row_bytes, 1) / multiple * multiple);
  at::parallel_for(0, (N + 3) / 4, block / 4, [&](int64_t b0, int64_t b1) {
    const int64_t end = std::min(N, b1 * 4);
    for (int64_t n = b0 * 4; n < end; n += block) kernel(n, std::min(end, n + block));
  });
}

// y = x2 @ panel(n0, nb)^T + bias over the output channels in panels of kPanelRows: panel(n0, nb)
// is those channels' weights dequantized to float32 [nb, K].
template <typename Panel>
void by_float_panels(const Tensor& x2, const Tensor& bias, Tensor& y, const Panel& panel) {
  const int64_t N = y.size(1);
  for (int64_t n0 = 0; n0 < N; n0 += kPanelRows) {
    const int64_t nb = std::min(kPanelRows, N - n0);
    Tensor part = at::mm(x2, panel(n0, nb).t());
    if (bias.defined()) part.add_(bias.narrow(0, n0, nb));
    y.narrow(1, n0, nb).copy_(part);
  }
}

using kernels::WeightTiles;

// w checked to be the row tiles of N rows of row_bytes bytes each (what `rows` describes).
void check_tiles(const Tensor& w, int64_t N, int64_t row_bytes, const char* rows) {
  const int64_t tiles = (N + WeightTiles::kRows - 1) / WeightTiles::kRows, chunks = WeightTiles::chunks(row_bytes);
  TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == tiles && w.size(1) == chunks && w.size(2) == WeightTiles::kLine,
                    "w must be the row tiles of the ", rows, " weight (qbackend.nn.weight_tiles.tile_rows): [",
                    tiles, ", ", chunks, ", ", WeightTiles::kLine, "] for ", N, " output channels of ", row_bytes,
                    " bytes, got ", w.sizes());
}

// Row n's first chunk in row tiles of rows of row_bytes bytes (its chunk c is kLine bytes further per c).
template <typename T>
const T* tile_row(const T* w, int64_t row_bytes, int64_t n) {
  return WeightTiles::at(w + n / WeightTiles::kRows * WeightTiles::tile_bytes(row_bytes), n % WeightTiles::kRows, 0);
}

// The int8-weight ops' arguments checked (their contract at the top of the file); the weight's N and K.
std::pair<int64_t, int64_t> check_int8(const Tensor& x, const Tensor& w_in, const Tensor& scales_in) {
  checks::dtype(x, at::kFloat, "x");
  checks::dtype(w_in, at::kChar, "w");
  checks::dtype(scales_in, at::kFloat, "scales");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension (its last is K)");
  TORCH_CHECK_VALUE(scales_in.dim() == 1 || (scales_in.dim() == 2 && scales_in.size(1) == 1),
                    "scales must be [N] or [N, 1] (one value per output channel), got ", scales_in.sizes());
  const int64_t N = scales_in.size(0), K = x.size(-1);
  check_tiles(w_in, N, K, "int8 [N, K]");
  return {N, K};
}

// The int8 weight's channels [n0, n0 + nb) dequantized to float32 (the panels beyond the kernels' rows).
Tensor int8_panel(const Tensor& w, const Tensor& scales, int64_t K, int64_t n0, int64_t nb) {
  Tensor panel = at::empty({nb, K}, at::kFloat);
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* pp = panel.data_ptr<float>();
  at::parallel_for(0, nb, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* row = tile_row(wp, K, n0 + r);
      const float s = sp[n0 + r];
      float* out = pp + r * K;
      for (int64_t c = 0; c * WeightTiles::kChunk < K; ++c) {  // a chunk's bytes: one short vector loop
        const int8_t* src = row + c * WeightTiles::kLine;
        float* dst = out + c * WeightTiles::kChunk;
        const int64_t count = std::min(WeightTiles::kChunk, K - c * WeightTiles::kChunk);
        for (int64_t b = 0; b < count; ++b) dst[b] = float(src[b]) * s;
      }
    }
  });
  return panel;
}

// The int4 ops' arguments checked (their contract at the top of the file); the weight's N and groups.
struct Int4Shape {
  int64_t N, ng;
};

Int4Shape check_int4(const Tensor& x, const Tensor& w_in, const Tensor& scales_in, const Tensor& offsets_in, int64_t G,
                     int64_t K, int64_t N) {
  checks::dtype(x, at::kFloat, "x");
  checks::dtype(w_in, at::kByte, "w");
  checks::dtype(scales_in, at::kHalf, "scales");
  checks::dtype(offsets_in, at::kHalf, "offsets");
  TORCH_CHECK_VALUE(G >= 16 && G % 16 == 0, "group_size must be a positive multiple of 16, got ", G);
  TORCH_CHECK_VALUE(K >= 1, "in_features must be >= 1, got ", K);
  TORCH_CHECK_VALUE(N >= 0, "out_features must be >= 0, got ", N);
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == K, "x's last dimension must be in_features ", K, ", got ",
                    x.dim() >= 1 ? x.size(-1) : 0);
  const int64_t ng = (K + G - 1) / G;
  const int64_t tiles = (N + WeightTiles::kRows - 1) / WeightTiles::kRows;
  TORCH_CHECK_VALUE(scales_in.dim() == 3 && scales_in.size(0) == tiles && scales_in.size(1) == ng &&
                        scales_in.size(2) == WeightTiles::kRows,
                    "scales must be the group tiles of the [out_features, ceil(in_features / group_size)] scales "
                    "(qbackend.nn.weight_tiles.tile_groups): [", tiles, ", ", ng, ", ", WeightTiles::kRows, "], got ",
                    scales_in.sizes());
  check_tiles(w_in, N, (K + 1) / 2, "4-bit [N, ceil(in_features / 2)]");
  TORCH_CHECK_VALUE(offsets_in.sizes() == scales_in.sizes(), "offsets must have the shape of scales ",
                    scales_in.sizes(), ", got ", offsets_in.sizes());
  return {N, ng};
}

// The dequantized-panel product of x2 [M, K] and the int4 weight, for the rows beyond the kernels':
// each panel's weights dequantized (scale * u + offset in float32) group by group by a plain loop,
// its rows shared out among the threads.
void int4_panels(const Tensor& x2, const Tensor& w, const Tensor& scales, const Tensor& offsets, int64_t G, int64_t K,
                 const Tensor& bias, Tensor& y) {
  const int64_t ng = (K + G - 1) / G, nbytes = (K + 1) / 2;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const at::Half* sp = scales.data_ptr<at::Half>();
  const at::Half* op = offsets.data_ptr<at::Half>();
  by_float_panels(x2, bias, y, [&](int64_t n0, int64_t nb) {
    Tensor panel = at::empty({nb, K}, at::kFloat);
    float* pp = panel.data_ptr<float>();
    at::parallel_for(0, nb, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = n0 + r;
        const uint8_t* row = tile_row(wp, nbytes, n);
        float* out = pp + r * K;
        // 16 k (8 bytes, half a chunk) at a time: they lie in one group (G is a multiple of 16)
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
          const uint8_t* src = row + k0 / 32 * WeightTiles::kLine + k0 % 32 / 2;
          const int64_t g = WeightTiles::group_at(n, k0 / G, ng);
          const float sc = static_cast<float>(sp[g]), of = static_cast<float>(op[g]);
          float* dst = out + k0;
          if (K - k0 >= 16) {
            for (int64_t b = 0; b < 8; ++b) {
              dst[2 * b] = sc * float(src[b] & 15) + of;
              dst[2 * b + 1] = sc * float(src[b] >> 4) + of;
            }
          } else {
            for (int64_t k = 0; k < K - k0; ++k) dst[k] = sc * float(k % 2 ? src[k / 2] >> 4 : src[k / 2] & 15) + of;
          }
        }
      }
    });
    return panel;
  });
}

// The rows of x [M, K] quantized by blocks of 32 k (woq_a8_kernels.h): the block scale d = max |x| / 127,
// xq = x / d rounded half to even (as torch.round). A block holding a NaN or an infinity gets a NaN
// scale, so its row's outputs are NaN (as a float product would not be finite). The buffers are the
// calling thread's, reused from call to call (a decode step allocates nothing for them); the kernels
// read them while that thread waits in parallel_for.
struct QuantizedScratch {
  std::vector<int8_t> even, odd, xq;
  std::vector<float> lane_scale, group_sum;
  std::vector<int32_t> block_offset;
};

QuantizedScratch& scratch() {
  thread_local QuantizedScratch s;
  return s;
}

// Rows of x a thread quantizes at least.
constexpr int64_t kQuantizeGrainRows = 16;

// row(m) for every row of x: on the calling thread up to kQuantizeGrainRows rows, as a plain loop (a decode
// step: run inside parallel_for's lambda, the loop made SmolLM2's W8A8 decode step 2-17% slower in three
// alternating pairs), else shared out among the threads (row writes only row m's part of the buffers).
template <typename Row>
void each_row(int64_t M, const Row& row) {
  if (M <= kQuantizeGrainRows) {
    for (int64_t m = 0; m < M; ++m) row(m);
    return;
  }
  at::parallel_for(0, M, kQuantizeGrainRows, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) row(m);
  });
}

kernels::BlockQuantizedRows quantize_blocks(const float* xp, int64_t M, int64_t K, int64_t G) {
  const int64_t Kp = (K + 127) / 128 * 128, ldq = Kp / 2, ldl = Kp / 8, ng = (K + G - 1) / G;
  QuantizedScratch& b = scratch();
  b.even.assign(size_t(M * ldq), 0);
  b.odd.assign(size_t(M * ldq), 0);
  b.lane_scale.assign(size_t(M * ldl), 0.0f);
  b.group_sum.assign(size_t(M * ng), 0.0f);
  const kernels::QuantizeRow4Fn quantize_row = woq_a8_kernels().quantize_row4;
  each_row(M, [&](int64_t m) {
    quantize_row(xp + m * K, K, G, b.even.data() + m * ldq, b.odd.data() + m * ldq, b.lane_scale.data() + m * ldl,
                 b.group_sum.data() + m * ng);
  });
  return {b.even.data(), b.odd.data(), ldq, b.lane_scale.data(), ldl, b.group_sum.data(), ng};
}

// The same quantization in k order for the int8-weight kernels (woq_a8_kernels.h, BlockQuantizedRows8),
// in the same per-thread buffers.
kernels::BlockQuantizedRows8 quantize_blocks8(const float* xp, int64_t M, int64_t K) {
  const int64_t ldq = (K + 63) / 64 * 64, ldl = ldq / 4, ldo = ldq / 8;
  QuantizedScratch& b = scratch();
  b.xq.assign(size_t(M * ldq), 0);
  b.lane_scale.assign(size_t(M * ldl), 0.0f);
  b.block_offset.assign(size_t(M * ldo), 0);
  const kernels::QuantizeRow8Fn quantize_row = woq_a8_kernels().quantize_row8;
  each_row(M, [&](int64_t m) {
    quantize_row(xp + m * K, K, b.xq.data() + m * ldq, b.lane_scale.data() + m * ldl, b.block_offset.data() + m * ldo);
  });
  return {b.xq.data(), ldq, b.lane_scale.data(), ldl, b.block_offset.data(), ldo};
}

// The rows as their block-quantized values (the semantics of woq4a8_linear), in float32.
Tensor dequantized_blocks(const kernels::BlockQuantizedRows& q, int64_t M, int64_t K) {
  Tensor out = at::empty({M, K}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int8_t v = (k % 2 ? q.odd : q.even)[m * q.ldq + k / 2];
      o[m * K + k] = float(v) * q.lane_scale[m * q.ldl + k / 8];
    }
  return out;
}

// The rows as their block-quantized values in k order (woq_a8_linear's semantics), in float32.
Tensor dequantized_blocks8(const kernels::BlockQuantizedRows8& q, int64_t M, int64_t K) {
  Tensor out = at::empty({M, K}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) o[m * K + k] = float(q.xq[m * q.ldq + k]) * q.lane_scale[m * q.ldl + k / 4];
  return out;
}

// woq_linear (int8_activations false) and woq_a8_linear (true).
Tensor int8_weight_linear(const Tensor& x, const Tensor& w_in, const Tensor& scales_in,
                          const std::optional<Tensor>& bias_in, bool int8_activations) {
  const auto [N, K] = check_int8(x, w_in, scales_in);
  const Tensor bias = checked_bias(bias_in, N);
  const Tensor w = w_in.contiguous();
  const Tensor scales = scales_in.contiguous();  // [N] or [N, 1]: N values in order
  const Rows rows = as_rows(x, K, N);
  const int64_t M = rows.M;
  Tensor y = at::empty(rows.out_shape, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return bias.defined() ? y.copy_(bias.expand_as(y)) : y.zero_();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const auto panel = [&](int64_t n0, int64_t nb) { return int8_panel(w, scales, K, n0, nb); };
  if (int8_activations) {
    const kernels::BlockQuantizedRows8 q = quantize_blocks8(rows.data(), M, K);
    if (M > kGemvA8MaxRows) {
      Tensor y2 = y.view({M, N});
      by_float_panels(dequantized_blocks8(q, M, K), bias, y2, panel);
      return y;
    }
    const auto& k = woq_a8_kernels();
    by_channel_blocks(N, K, [&](int64_t n0, int64_t n1) { k.gemv_s8a8(q, M, wp, K, n0, n1, sp, bp, yp, N); },
                      M > kernels::kRowsPerPass ? 16 : 4);
    return y;
  }
  if (M > kGemvMaxRows) {
    Tensor y2 = y.view({M, N});
    by_float_panels(rows.matrix(K), bias, y2, panel);
    return y;
  }
  const auto& k = woq_kernels();
  const float* xp = rows.data();
  by_channel_blocks(N, K, [&](int64_t n0, int64_t n1) { k.gemv_s8(xp, K, M, wp, K, n0, n1, sp, bp, yp, N); });
  return y;
}

// woq4_linear (int8_activations false) and woq4a8_linear (true).
Tensor int4_weight_linear(const Tensor& x, const Tensor& w_in, const Tensor& scales_in, const Tensor& offsets_in,
                          int64_t G, int64_t K, int64_t N_in, const std::optional<Tensor>& bias_in,
                          bool int8_activations) {
  const auto [N, ng] = check_int4(x, w_in, scales_in, offsets_in, G, K, N_in);
  TORCH_CHECK_VALUE(!int8_activations || (G & (G - 1)) == 0,
                    "group_size must be a power of two with int8 activations, got ", G);
  const Tensor bias = checked_bias(bias_in, N);
  const Tensor w = w_in.contiguous(), scales = scales_in.contiguous(), offsets = offsets_in.contiguous();
  const Rows rows = as_rows(x, K, N);
  const int64_t M = rows.M;
  Tensor y = at::empty(rows.out_shape, x.options());
  if (M == 0 || N == 0) return y;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const auto* sp = reinterpret_cast<const kernels::F16*>(scales.data_ptr<at::Half>());
  const auto* op = reinterpret_cast<const kernels::F16*>(offsets.data_ptr<at::Half>());
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (int8_activations) {
    const kernels::BlockQuantizedRows q = quantize_blocks(rows.data(), M, K, G);
    if (M > kGemv4A8MaxRows) {
      Tensor y2 = y.view({M, N});
      int4_panels(dequantized_blocks(q, M, K), w, scales, offsets, G, K, bias, y2);
      return y;
    }
    const auto& k = woq_a8_kernels();
    by_channel_blocks(N, (K + 1) / 2, [&](int64_t n0, int64_t n1) {
      k.gemv_u4a8(q, M, wp, K, G, n0, n1, sp, op, bp, yp, N);
    });
    return y;
  }
  if (M > kGemv4MaxRows) {
    Tensor y2 = y.view({M, N});
    int4_panels(rows.matrix(K), w, scales, offsets, G, K, bias, y2);
    return y;
  }
  const auto& k = woq_kernels();
  const float* xp = rows.data();
  by_channel_blocks(N, (K + 1) / 2, [&](int64_t n0, int64_t n1) {
    k.gemv_u4(xp, K, M, wp, K, G, n0, n1, sp, op, bp, yp, N);
  });
  return y;
}

}  // namespace

Tensor woq_linear(const Tensor& x, const Tensor& w, const Tensor& scales, const std::optional<Tensor>& bias) {
  return int8_weight_linear(x, w, scales, bias, false);
}

Tensor woq_a8_linear(const Tensor& x, const Tensor& w, const Tensor& scales, const std::optional<Tensor>& bias) {
  return int8_weight_linear(x, w, scales, bias, true);
}

Tensor woq4_linear(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& offsets, int64_t G, int64_t K,
                   int64_t N, const std::optional<Tensor>& bias) {
  return int4_weight_linear(x, w, scales, offsets, G, K, N, bias, false);
}

Tensor woq4a8_linear(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& offsets, int64_t G,
                     int64_t K, int64_t N, const std::optional<Tensor>& bias) {
  return int4_weight_linear(x, w, scales, offsets, G, K, N, bias, true);
}

}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("woq_linear(Tensor x, Tensor w, Tensor scales, Tensor? bias=None) -> Tensor");
  m.def("woq4_linear(Tensor x, Tensor w, Tensor scales, Tensor offsets, int group_size, int in_features, "
        "int out_features, Tensor? bias=None) -> Tensor");
  m.def("woq_a8_linear(Tensor x, Tensor w, Tensor scales, Tensor? bias=None) -> Tensor");
  m.def("woq4a8_linear(Tensor x, Tensor w, Tensor scales, Tensor offsets, int group_size, int in_features, "
        "int out_features, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("woq_linear", &qbackend::ops::woq_linear);
  m.impl("woq4_linear", &qbackend::ops::woq4_linear);
  m.impl("woq4a8_linear", &qbackend::ops::woq4a8_linear);
  m.impl("woq_a8_linear", &qbackend::ops::woq_a8_linear);
}

// The kernel table in use (qbackend._C.woq_isa, for the tests).
namespace qbackend::ops {
const char* woq_kernel_name() { return woq_kernels().name; }
const char* woq_a8_kernel_name() { return woq_a8_kernels().name; }
}  // namespace qbackend::ops
