// The native provider for convolutions with groups 1 (any kernel, stride, padding, dilation): a
// GEMM over the channels-last output pixels with qbackend's own int8 kernel (csrc/kernels/gemm_*),
// the residual add and relu fused in its epilogue.
//   * Unpadded 1x1, stride 1: the pixels are the GEMM's rows, read in place.
//   * Unpadded 1x1, strided: the pixels read are gathered into one block first.
//   * Stride 1 or 2 over a multiple of 64 channels, on a kernel with a direct convolution (AMX; on
//     AVX512-VNNI stride 1 with a weight that stays in L2): bands of output rows over a
//     zero-point-padded copy of their input (split into phase planes at stride 2), no taps gathered
//     (kernels::DirectConvArgs, csrc/kernels/conv_amx.cpp, conv_avx512_vnni.cpp).
//   * 3x3, stride 1, on AVX2 CPUs without VNNI, where the packing added the Winograd filter:
//     Winograd's F(2x2, 3x3) transform (native_winograd.h), exact, the same bytes as the GEMM.
//   * Otherwise: each output pixel's taps (KH x KW x C bytes; the activation's zero point where a
//     tap falls in the padding, which adds nothing to the sums) are gathered into a row, in blocks
//     of rows that stay in L2 (per thread, in a reused buffer: nothing allocated per call but the
//     output), and each block is one GEMM against the weight [OC, KH * KW * C].
//   * Depthwise (groups = in = out channels; the packed weight says so): native_depthwise.h.
// Other grouped convolutions are not this provider's: the router sends them elsewhere, and these
// ops refuse them with a ValueError.
//
// Ops (torch.ops.qbackend):
//   native_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor
//   native_conv2d(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
//                 output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
//                 accum_zero_point) -> Tensor                                  (channels-last output)
//   native_conv2d_add_(... the same, Tensor(a!) accum ...) -> ()   the result written into accum
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/checks.h"
#include "common/conv_params.h"
#include "providers/native_depthwise.h"
#include "providers/native_gemm.h"
#include "providers/native_winograd.h"
#include "runtime/activation_cache.h"
#include "runtime/parallel.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

using kernels::GemmArgs;

at::Tensor native_conv2d_prepack(const at::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation, int64_t groups) {
  check_conv_weight(weight, groups);
  const Conv2dParams p = conv2d_params(stride, padding, dilation, groups);
  if (groups == 1) return native::pack_conv(weight, native::winograd_packs(weight.size(1), weight.size(2),
                                                                          weight.size(3), p));
  const std::string why = native::depthwise_refusal(weight, groups);
  TORCH_CHECK_VALUE(why.empty(), "the native provider cannot run this convolution (weight ", weight.sizes(),
                    ", groups ", groups, "): ", why, "; use the onednn or fbgemm provider");
  TORCH_CHECK_VALUE((weight.size(2) - 1) * p.dilation[0] + 1 <= 256, "the native depthwise conv takes a dilated "
                    "kernel height of at most 256 rows");
  return native::pack_depthwise(weight);
}

// Multiply-adds from which a conv (gathered taps or direct) runs on every thread.
constexpr int64_t kParallelConvWork = int64_t(1) << 22;

// Bytes of gathered taps per block of rows: the block stays in L2 with the weight's panel.
constexpr int64_t kTapBlockBytes = int64_t(192) << 10;

// Bytes a tap buffer holds beyond its rows: a segment copy may write up to 64 bytes from a row's
// last segment (CopySegment).
constexpr int64_t kTapSlack = 64;

// Copies the n bytes of one kernel row's taps. Short segments (the KW x C bytes of a stem's kernel
// row: 9 for 3x3 over 3 channels, 21 for 7x7) move as one fixed-size 16/32/64-byte copy, which
// writes past the segment into bytes the next segment (or the next row) overwrites afterwards, or
// into the buffer's slack; it reads past the segment only where that stays inside x.
inline void copy_segment(uint8_t* d, const uint8_t* src, int64_t n, const uint8_t* x_end) {
  if (n <= 16 && src + 16 <= x_end) std::memcpy(d, src, 16);
  else if (n <= 32 && src + 32 <= x_end) std::memcpy(d, src, 32);
  else if (n <= 64 && src + 64 <= x_end) std::memcpy(d, src, 64);
  else std::memcpy(d, src, static_cast<size_t>(n));
}

// The taps of output pixels [p0, p1) (pixel = (n * OH + oh) * OW + ow) as rows of dst, `stride`
// bytes apart: row entry (kh * KW + kw) * C + c = x[n, c, oh * sh - ph + kh * dh,
// ow * sw - pw + kw * dw], or `pad` (the zero point's byte) outside the image. A row's bytes past
// KH * KW * C (a padded GEMM K) hold whatever the buffer held: the weight's zero columns multiply
// them. dst holds kTapSlack bytes beyond the rows.
struct Taps {
  const uint8_t* x;  // channels-last [N, H, W, C]
  const uint8_t* x_end;  // one past x's last byte
  int64_t C, H, W, OH, OW, KH, KW;
  Conv2dParams p;
  uint8_t pad;
  int64_t stride;  // bytes from one pixel's row to the next: KH * KW * C, or the GEMM's padded K

  // One pixel's row, any position (padding written as `pad`).
  void gather_pixel(int64_t n, int64_t oh, int64_t ow, uint8_t* row) const {
    const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
    const int64_t dh = p.dilation[0], dw = p.dilation[1];
    const int64_t seg = KW * C;
    const int64_t iw0 = ow * sw - pw;
    const bool row_inside = iw0 >= 0 && iw0 + (KW - 1) * dw < W;
    const uint8_t* image = x + n * H * W * C;
    for (int64_t kh = 0; kh < KH; ++kh) {
      const int64_t ih = oh * sh - ph + kh * dh;
      uint8_t* d = row + kh * seg;
      if (ih < 0 || ih >= H) {
        std::memset(d, pad, static_cast<size_t>(seg));
        continue;
      }
      const uint8_t* src = image + ih * W * C;
      if (row_inside && dw == 1) {  // the KW taps are adjacent pixels: one copy
        copy_segment(d, src + iw0 * C, seg, x_end);
        continue;
      }
      for (int64_t kw = 0; kw < KW; ++kw) {
        const int64_t iw = iw0 + kw * dw;
        if (iw < 0 || iw >= W) std::memset(d + kw * C, pad, static_cast<size_t>(C));
        else std::memcpy(d + kw * C, src + iw * C, static_cast<size_t>(C));
      }
    }
  }

  // Pixels [ow0, ow1) of output row (n, oh), all inside the image horizontally and vertically, with
  // adjacent taps: each kernel row one fixed-size copy of B >= KW * C bytes, from row pointers set
  // once (the caller checked that reading B bytes stays inside x). RH > 0: KH == RH, known here,
  // so that the row pointers stay in registers.
  template <int B, int RH>
  void gather_inside(int64_t n, int64_t oh, int64_t ow0, int64_t ow1, uint8_t* dst) const {
    const int64_t rows = RH > 0 ? RH : KH;
    const int64_t seg = KW * C, K = stride, step = p.stride[1] * C;
    const uint8_t* src[RH > 0 ? RH : 64];
    for (int64_t kh = 0; kh < rows; ++kh)
      src[kh] = x + ((n * H + oh * p.stride[0] - p.padding[0] + kh * p.dilation[0]) * W +
                     ow0 * p.stride[1] - p.padding[1]) * C;
    for (int64_t ow = ow0; ow < ow1; ++ow, dst += K) {
#pragma GCC unroll 8
      for (int64_t kh = 0; kh < rows; ++kh) {
        std::memcpy(dst + kh * seg, src[kh], B);
        src[kh] += step;
      }
    }
  }

  template <int B>
  void gather_inside(int64_t n, int64_t oh, int64_t ow0, int64_t ow1, uint8_t* dst) const {
    switch (KH) {
      case 3: return gather_inside<B, 3>(n, oh, ow0, ow1, dst);
      case 5: return gather_inside<B, 5>(n, oh, ow0, ow1, dst);
      case 7: return gather_inside<B, 7>(n, oh, ow0, ow1, dst);
      default: return gather_inside<B, 0>(n, oh, ow0, ow1, dst);
    }
  }

  void gather(int64_t p0, int64_t p1, uint8_t* dst) const {
    const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
    const int64_t seg = KW * C, K = stride;
    // output columns whose taps are all inside horizontally: [lo, hi)
    const int64_t lo = std::min(OW, (pw + sw - 1) / sw);
    const int64_t hi = std::max(lo, std::min(OW, W - (KW - 1) * p.dilation[1] + pw > 0
                                                     ? (W - (KW - 1) * p.dilation[1] + pw - 1) / sw + 1 : 0));
    const int copy = p.dilation[1] != 1 ? 0 : seg <= 16 ? 16 : seg <= 32 ? 32 : seg <= 64 ? 64 : 0;
    int64_t pix = p0;
    while (pix < p1) {
      const int64_t n = pix / (OH * OW), oh = pix / OW % OH, ow_begin = pix % OW;
      const int64_t ow_end = std::min(OW, ow_begin + (p1 - pix));
      uint8_t* row = dst + (pix - p0) * K;
      const int64_t ih_first = oh * sh - ph, ih_last = ih_first + (KH - 1) * p.dilation[0];
      int64_t a = std::max(ow_begin, lo), b = std::min(ow_end, hi);
      bool fast = copy > 0 && ih_first >= 0 && ih_last < H && a < b;
      if (fast) {  // the last copy of the run must stay inside x
        const uint8_t* last = x + ((n * H + ih_last) * W + (b - 1) * sw - pw) * C;
        fast = last + copy <= x_end;
      }
      if (!fast) a = b = ow_end;
      for (int64_t ow = ow_begin; ow < a; ++ow) gather_pixel(n, oh, ow, row + (ow - ow_begin) * K);
      if (a < b) {
        uint8_t* d = row + (a - ow_begin) * K;
        if (copy == 16) gather_inside<16>(n, oh, a, b, d);
        else if (copy == 32) gather_inside<32>(n, oh, a, b, d);
        else gather_inside<64>(n, oh, a, b, d);
      }
      for (int64_t ow = b; ow < ow_end; ++ow) gather_pixel(n, oh, ow, row + (ow - ow_begin) * K);
      pix += ow_end - ow_begin;
    }
  }
};

// The thread's buffer for gathered taps (and kTapSlack bytes).
uint8_t* tap_buffer(int64_t bytes) { return native::conv_scratch(bytes + kTapSlack); }

int64_t out_element_bytes(kernels::GemmOut t) {
  return t == kernels::GemmOut::f32 ? 4 : t == kernels::GemmOut::bf16 ? 2 : 1;
}

// The general case: blocks of gathered taps, each one GEMM. With enough pixels each thread takes an
// equal range of them (in multiples of the kernel's row tile) and runs it block by block (gather,
// then GEMM over every panel); otherwise the caller gathers every pixel and the GEMM splits over
// the threads as a Linear would (by panels when the rows are few).
void run_gathered(const GemmArgs& g0, const Taps& t, int64_t pixels) {
  const int64_t K = t.stride, esize = out_element_bytes(g0.out_type);
  const auto& k = native::gemm_kernels(g0);
  const int64_t rt = k.row_tile;
  const int64_t block = std::max<int64_t>(rt, kTapBlockBytes / K / rt * rt);
  const bool big = pixels * g0.N * K >= kParallelConvWork;
  const int threads = big ? at::get_num_threads() : 1;
  auto rows_at = [&](GemmArgs& g, int64_t p0, int64_t rows, uint8_t* taps) {
    g.M = rows;
    g.a = taps;
    g.lda = K;
    g.a_cached = true;  // gathered just before
    g.r = g0.r ? g0.r + p0 * g0.ldr : nullptr;
    g.out = static_cast<uint8_t*>(g0.out) + p0 * g0.ldc * esize;
  };
  if (threads <= 1 ? pixels <= block : pixels < 4 * rt * threads) {
    uint8_t* taps = tap_buffer(pixels * K);
    t.gather(0, pixels, taps);
    GemmArgs g = g0;
    rows_at(g, 0, pixels, taps);
    native::run(g);
    return;
  }
  const int64_t panels = kernels::gemm_num_panels(g0.N), tiles = (pixels + rt - 1) / rt;
  parallel::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    uint8_t* taps = tap_buffer(block * K);
    for (int64_t th = t0; th < t1; ++th) {
      const int64_t begin = std::min(pixels, tiles * th / threads * rt);
      const int64_t end = std::min(pixels, tiles * (th + 1) / threads * rt);
      for (int64_t p0 = begin; p0 < end; p0 += block) {
        const int64_t rows = std::min(block, end - p0);
        t.gather(p0, p0 + rows, taps);
        GemmArgs g = g0;
        rows_at(g, p0, rows, taps);
        k.gemm(g, 0, rows, 0, panels);
      }
    }
  });
}

// Whether stride-1 and -2 convs over a multiple of 64 channels run on the kernel's direct convolution
// where it has one (set_direct_conv: tests and benchmarks compare it with the gathered taps).
std::atomic<bool> g_direct_conv{true};
// Convs that ran on the direct convolution since the process started (tests check the route).
std::atomic<int64_t> g_direct_calls{0};

// Bytes of padded input rows per band of the direct conv: the band stays in L2 beside the weight.
constexpr int64_t kDirectBandBytes = int64_t(256) << 10;

// The direct convolution (kernels::DirectConvArgs) where the kernel has one and the conv suits it
// (stride 1 or 2, C a multiple of 64, at most kDirectConvMaxTaps taps, and the kernel's own limits:
// GemmKernels::direct_conv_stride1, direct_conv_max_weight), in bands of output rows:
// each thread a range of (image, band) units, or, where there are fewer images than threads and the
// weight outweighs an image's planes (the deep layers at batch 1), every unit over its share of the
// weight's panels; false where it does not apply.
bool run_direct(const GemmArgs& g0, const Taps& t, int64_t N) {
  const auto& k = native::gemm_kernels(g0);
  if (!k.direct_conv || !g_direct_conv.load(std::memory_order_relaxed) || t.p.stride[0] > 2 || t.p.stride[1] > 2 ||
      t.C % 64 != 0 || t.KH * t.KW > kernels::kDirectConvMaxTaps)
    return false;
  if (k.direct_conv_stride1 && (t.p.stride[0] != 1 || t.p.stride[1] != 1)) return false;
  if (k.direct_conv_max_weight > 0 && g0.K * g0.N > k.direct_conv_max_weight) return false;
  kernels::DirectConvArgs a;
  a.g = g0;
  a.x = t.x;
  a.C = t.C, a.H = t.H, a.W = t.W, a.OH = t.OH, a.OW = t.OW, a.KH = t.KH, a.KW = t.KW;
  a.sh = t.p.stride[0], a.sw = t.p.stride[1], a.ph = t.p.padding[0], a.pw = t.p.padding[1];
  a.dh = t.p.dilation[0], a.dw = t.p.dilation[1];
  a.pad = t.pad;
  const int64_t panels = kernels::gemm_num_panels(g0.N);
  const int64_t row_bytes = a.sh * a.sw * kernels::direct_plane_width(a) * a.C;  // of planes, per output row
  int64_t band = std::clamp<int64_t>(kDirectBandBytes / row_bytes - (a.KH - 1) * a.dh / a.sh, 1, a.OH);
  const bool big = N * a.OH * a.OW * g0.N * g0.K >= kParallelConvWork;
  const int64_t threads = big ? at::get_num_threads() : 1;
  const bool by_panels = threads > 1 && N < threads && panels >= threads &&
                         g0.N * g0.K >= kernels::direct_conv_scratch_bytes(a, a.OH);
  if (!by_panels && N * ((a.OH + band - 1) / band) < threads) {  // too few units: one band per thread at least
    const int64_t per_image = (threads + N - 1) / N;
    band = std::max<int64_t>(1, (a.OH + per_image - 1) / per_image);
  }
  g_direct_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t bands = (a.OH + band - 1) / band, units = N * bands;
  const int64_t scratch = kernels::direct_conv_scratch_bytes(a, band);
  auto run_units = [&](int64_t u0, int64_t u1, int64_t p0, int64_t p1) {
    uint8_t* s = native::conv_scratch(scratch);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / bands, oh0 = u % bands * band;
      k.direct_conv(a, n, oh0, std::min(a.OH, oh0 + band), p0, p1, s);
    }
  };
  if (threads <= 1 || (units == 1 && !by_panels)) run_units(0, units, 0, panels);
  else if (by_panels)
    parallel::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t th = t0; th < t1; ++th) run_units(0, units, panels * th / threads, panels * (th + 1) / threads);
    });
  else parallel::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) { run_units(u0, u1, 0, panels); });
  return true;
}

// What the checks established, for the kernel call.
struct Checked {
  std::vector<int64_t> shape;  // the output's [N, OC, OH, OW]
  native::PackedView w;        // a GEMM weight (groups 1), or
  bool depthwise = false;
  native::DepthwiseView dw;    // a depthwise one
  Conv2dParams p;
  checks::PostOp op;
};

// y (or accum, when it takes the result) [N, OC, OH, OW] channels-last.
void conv_impl(const Checked& c, const at::Tensor& x, double x_scale, int64_t x_zero_point,
               const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, double output_scale,
               int64_t output_zero_point, at::ScalarType output_dtype, const std::optional<at::Tensor>& accum,
               double accum_scale, int64_t accum_zero_point, at::Tensor& y) {
  const at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor ws = w_scales.contiguous();
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  const bool has_accum = accum.has_value() && accum->defined();
  const at::Tensor r = has_accum ? accum->contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
  const native::PackedView& w = c.w;
  const Conv2dParams& p = c.p;
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = y.size(2), OW = y.size(3);

  GemmArgs g = native::gemm_args(c.depthwise ? native::PackedView{} : w, x.scalar_type(), x_zero_point, x_scale, ws,
                                 b, c.op, output_dtype, output_scale, output_zero_point);
  g.r_int8 = has_accum && r.scalar_type() == at::kChar;
  g.r_zp = static_cast<int32_t>(accum_zero_point);
  g.r_scale = static_cast<float>(accum_scale);
  g.ldr = w.N;
  const uint8_t* xp = static_cast<const uint8_t*>(xc.const_data_ptr());
  const uint8_t* rp = has_accum ? static_cast<const uint8_t*>(r.const_data_ptr()) : nullptr;
  uint8_t* yp = static_cast<uint8_t*>(y.data_ptr());
  if (c.depthwise) {
    kernels::DepthwiseArgs a;
    a.x = xp;
    a.x_int8 = x.scalar_type() == at::kChar;
    a.x_zp = static_cast<int32_t>(x_zero_point);
    a.N = N, a.C = C, a.H = H, a.W = W, a.OH = OH, a.OW = OW, a.KH = c.dw.KH, a.KW = c.dw.KW;
    a.sh = p.stride[0], a.sw = p.stride[1], a.ph = p.padding[0], a.pw = p.padding[1];
    a.dh = p.dilation[0], a.dw = p.dilation[1];
    a.epi = g;
    a.epi.r = rp;
    a.epi.ldr = C;
    a.epi.out = yp;
    native::run_depthwise(a, c.dw);
    return;
  }
  if (w.KH != 1 || w.KW != 1 || p.padding[0] != 0 || p.padding[1] != 0) {
    g.r = rp;
    g.out = yp;
    if (native::run_winograd(g, w, xp, x.scalar_type() == at::kChar, static_cast<int32_t>(x_zero_point), N, C, H, W,
                             OH, OW, p))
      return;
    const Taps t{xp, xp + xc.numel(), C, H, W, OH, OW, w.KH, w.KW, p, static_cast<uint8_t>(x_zero_point), w.Kg};
    if (!run_direct(g, t, N)) run_gathered(g, t, N * OH * OW);
    return;
  }
  if (p.stride[0] == 1 && p.stride[1] == 1) {  // every pixel: one GEMM over N*H*W rows
    g.M = N * H * W;
    g.a = xp;
    g.lda = C;
    g.r = rp;
    g.out = yp;
    native::run(g);
    return;
  }
  // Strided: the pixels the kernel reads are gathered into a contiguous [N*OH*OW, C] block first
  // (C bytes per pixel, a small copy next to the GEMM), so that the weight is read once for all of
  // them as in the unstrided case (one GEMM per output row read it OH times per image:
  // benchmarks/results/design_measurements.md, "Strided 1x1 convs").
  const int64_t pixels = N * OH * OW;
  at::Tensor gathered = at::empty({pixels, C}, at::kByte);
  uint8_t* gp = gathered.data_ptr<uint8_t>();
  parallel::parallel_for(0, N * OH, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, OW * C)),
                         [&](int64_t begin, int64_t end) {
                           for (int64_t row = begin; row < end; ++row) {
                             const int64_t n = row / OH, oh = row % OH;
                             const uint8_t* src = xp + ((n * H + oh * p.stride[0]) * W) * C;
                             uint8_t* dst = gp + row * OW * C;
                             for (int64_t ow = 0; ow < OW; ++ow)
                               std::memcpy(dst + ow * C, src + ow * p.stride[1] * C, static_cast<size_t>(C));
                           }
                         });
  g.M = pixels;
  g.a = gp;
  g.lda = C;
  g.r = rp;
  g.out = yp;
  native::run(g);
}

// The checks of both entry points.
Checked check_all(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                  const at::Tensor& w_scales, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                  int64_t groups, double output_scale, int64_t output_zero_point,
                  at::ScalarType output_dtype, const std::string& post_op,
                  const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point) {
  checks::activation(x, x_scale, x_zero_point);
  const Conv2dParams p = conv2d_params(stride, padding, dilation, groups);
  Checked c;
  c.p = p;
  c.op = checks::post_op(post_op);
  int64_t OC = 0;
  std::array<int64_t, 2> o{};
  if (native::is_depthwise(w_packed)) {
    c.depthwise = true;
    c.dw = native::unpack_depthwise(w_packed, "w_packed");
    TORCH_CHECK_VALUE(p.groups == c.dw.C, "w_packed is a depthwise weight for ", c.dw.C, " channels, so groups must be ",
                      c.dw.C, ", got ", p.groups);
    TORCH_CHECK_VALUE((c.dw.KH - 1) * p.dilation[0] + 1 <= 256, "the native depthwise conv takes a dilated kernel "
                      "height of at most 256 rows");
    o = check_conv_input(x, c.dw.C, c.dw.KH, c.dw.KW, p);
    OC = c.dw.C;
  } else {
    c.w = native::unpack_conv(w_packed, "w_packed");
    TORCH_CHECK_VALUE(p.groups == 1, "w_packed is a weight for groups 1, got groups ", p.groups);
    o = check_conv_input(x, c.w.K / (c.w.KH * c.w.KW), c.w.KH, c.w.KW, p);
    OC = c.w.N;
  }
  checks::scales(w_scales, OC, "w_scales");
  checks::bias(bias, OC);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  c.shape = {x.size(0), OC, o[0], o[1]};
  check_accum(accum, accum_scale, accum_zero_point, c.shape);
  native::gemm_kernels();  // raises on a CPU without the kernels
  return c;
}

at::Tensor native_conv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                         at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, double output_scale,
                         int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
                         const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point) {
  const Checked c = check_all(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
                              output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
                              accum_zero_point);
  at::Tensor y = runtime::empty_output(
      c.shape, at::TensorOptions().dtype(output_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  conv_impl(c, x, x_scale, x_zero_point, w_scales, bias, output_scale, output_zero_point, output_dtype, accum,
            accum_scale, accum_zero_point, y);
  return y;
}

// The residual conv writing its result into accum, which the caller gives up (each output element
// is computed from the same element of accum, in place): saves allocating the output.
void native_conv2d_add_(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                        const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, double output_scale,
                        int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
                        at::Tensor& accum, double accum_scale, int64_t accum_zero_point) {
  check_accum_does_not_alias(accum, x, w_packed, bias, "native_conv2d_add_");
  TORCH_CHECK_VALUE(accum.scalar_type() == output_dtype, "native_conv2d_add_ writes the result into accum, so accum "
                    "must have the output dtype ", checks::dtype_name(output_dtype), ", got ",
                    checks::dtype_name(accum.scalar_type()));
  const Checked c = check_all(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
                              output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
                              accum_zero_point);
  if (accum.numel() == 0) return;
  if (accum.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    conv_impl(c, x, x_scale, x_zero_point, w_scales, bias, output_scale, output_zero_point, output_dtype, accum,
              accum_scale, accum_zero_point, accum);
    return;
  }
  at::Tensor y = at::empty(accum.sizes(), accum.options().memory_format(at::MemoryFormat::ChannelsLast));
  conv_impl(c, x, x_scale, x_zero_point, w_scales, bias, output_scale, output_zero_point, output_dtype, accum,
            accum_scale, accum_zero_point, y);
  accum.copy_(y);
}

}  // namespace

namespace native {
void set_direct_conv(bool enabled) { g_direct_conv.store(enabled, std::memory_order_relaxed); }
int64_t direct_conv_calls() { return g_direct_calls.load(std::memory_order_relaxed); }
}  // namespace native

// The schemas: providers/registrations.cpp.
void register_native_conv2d(torch::Library& m) {
  impl_each(m, "native_conv2d_prepack", &native_conv2d_prepack,
            "native_conv2d", &native_conv2d,
            "native_conv2d_add_", &native_conv2d_add_);
}

}  // namespace qbackend
