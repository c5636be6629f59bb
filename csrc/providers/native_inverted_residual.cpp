// The native provider's fused inverted-residual block (MobileNetV2's): an optional 1x1 expansion
// conv, a depthwise conv and a 1x1 projection conv, with an optional residual, computed in tiles of
// output rows so that the expanded activation and the depthwise output live only in a per-thread
// buffer that stays in L2, instead of going to memory and back between three op calls.
//
//   e = expand(x)           1x1, groups 1, stride 1, no padding: requantized to expand_dtype
//   d = depthwise(e)        any kernel, stride, padding, dilation: requantized to dw_dtype
//   y = project(d) [+ accum] 1x1, groups 1, stride 1, no padding: output_dtype
//
// Each stage is exactly the native conv op of its own (native_conv.cpp, native_depthwise.h: the same
// kernels, the same integer sums, the same requantization), so y equals the three ops called one
// after another bit for bit; only where the intermediate values live changes.
//
// Tiles: a thread takes a range of output rows (whole images when there are at least as many images
// as threads, else rows of one image), and walks it in tiles of rows of one image. For a tile it
// expands the input rows the depthwise conv reads that the previous tile did not already expand
// (those it shares are moved to the front of the buffer), runs the depthwise conv on the tile into a
// second buffer (the depthwise kernel keeps its laid-out rows from one tile to the next), and the
// projection on that buffer straight into y.
//
// Op (torch.ops.qbackend):
//   native_inverted_residual(x, x_scale, x_zero_point,
//       expand_w?, expand_scales?, expand_bias?, expand_scale, expand_zero_point, expand_dtype, expand_post_op,
//       dw_w, dw_scales, dw_bias?, stride, padding, dilation, dw_scale, dw_zero_point, dw_dtype, dw_post_op,
//       project_w, project_scales, project_bias?, output_scale, output_zero_point, output_dtype, post_op,
//       accum?, accum_scale, accum_zero_point) -> Tensor                   (channels-last output)
// The weights are the native provider's packed ones (native_conv2d_prepack); expand_w None: no
// expansion (the depthwise conv reads x). Needs AVX2 (the native GEMM and depthwise kernels of this
// CPU: native::gemm_kernels, native::depthwise_kernel).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/checks.h"
#include "common/conv_params.h"
#include "cpu/probe.h"
#include "providers/native_depthwise.h"
#include "providers/native_gemm.h"
#include "providers/registrations.h"
#include "runtime/activation_cache.h"
#include "runtime/parallel.h"

namespace qbackend {
namespace {

using kernels::GemmArgs;

// Bytes of a tile's expanded rows plus its depthwise output: they stay in L2 with the two 1x1
// weights and the depthwise kernel's laid-out rows.
constexpr int64_t kTileBytes = int64_t(160) << 10;
// Multiply-adds below which the block runs on the calling thread.
constexpr int64_t kParallelWork = int64_t(1) << 20;

struct Stage1x1 {
  native::PackedView w;
  GemmArgs g;  // all but M, a, out, r (set per tile)
};

// A 1x1 conv weight the fused block can run: native, 1x1, `in` input channels.
native::PackedView unpack_1x1(const at::Tensor& packed, const char* name, int64_t in) {
  const native::PackedView w = native::unpack_conv(packed, name);
  TORCH_CHECK_VALUE(w.KH == 1 && w.KW == 1, name, " must be a 1x1 conv weight, got a ", w.KH, "x", w.KW, " one");
  TORCH_CHECK_VALUE(w.K == in, name, " takes ", w.K, " input channels, but the stage before gives ", in);
  return w;
}

void check_stage_output(double scale, int64_t zero_point, at::ScalarType dtype, const char* scale_name,
                        const char* zp_name, const char* dtype_name) {
  TORCH_CHECK_TYPE(checks::is_int8_type(dtype), dtype_name, " must be uint8 or int8 (the fused block keeps its "
                   "intermediate values in int8), got ", checks::dtype_name(dtype));
  checks::scale(scale, scale_name);
  checks::zero_point(zero_point, dtype, zp_name);
}

// A stage's scales and bias (checked), kept alive by the caller's tensors.
struct StageTensors {
  at::Tensor scales, bias;
};

StageTensors stage_tensors(const at::Tensor& scales, const std::optional<at::Tensor>& bias, int64_t n,
                           const char* scales_name, const char* bias_name) {
  checks::scales(scales, n, scales_name);
  if (bias.has_value() && bias->defined()) {
    checks::dtype(*bias, at::kFloat, bias_name);
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->numel() == n, bias_name, " must be 1-D with ", n,
                      " elements, got shape ", bias->sizes());
  }
  return {scales.contiguous(), bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor()};
}

// A buffer per thread (tile buffers and the depthwise scratch), grown as needed and kept.
uint8_t* thread_buffer(size_t bytes) {
  static thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

struct Block {
  bool has_expand = false;
  Stage1x1 expand, project;
  kernels::DepthwiseArgs dw;  // x, x_row0, epi.out, out_pixel0, keep_rings set per tile
  const native::DepthwiseKernel* dw_kernel = nullptr;  // native::depthwise_kernel(), chosen once per call
  const uint8_t* x = nullptr;  // [N, H, W, Cin]
  const uint8_t* accum = nullptr;
  uint8_t* y = nullptr;
  int64_t N = 0, Cin = 0, H = 0, W = 0, Cmid = 0, OH = 0, OW = 0, Cout = 0;
  int64_t y_elem = 1;         // bytes of an output element
  int64_t tile_rows = 1;      // output rows per tile

  int64_t first_input_row(int64_t oh) const { return std::max<int64_t>(0, oh * dw.sh - dw.ph); }
  int64_t last_input_row(int64_t oh) const {
    return std::min<int64_t>(H - 1, oh * dw.sh - dw.ph + (dw.KH - 1) * dw.dh);
  }
  size_t expanded_bytes() const {
    return has_expand ? static_cast<size_t>(((tile_rows - 1) * dw.sh + (dw.KH - 1) * dw.dh + 1) * W * Cmid) : 0;
  }
  size_t dw_out_bytes() const { return static_cast<size_t>(tile_rows * OW * Cmid); }

  // Output rows [begin, end) (row = n * OH + oh).
  void rows(int64_t begin, int64_t end) const {
    const size_t eb = (expanded_bytes() + 63) / 64 * 64, db = (dw_out_bytes() + 63) / 64 * 64;
    kernels::DepthwiseArgs d = dw;
    const size_t sb = dw_kernel->scratch_bytes(d);
    uint8_t* buf = thread_buffer(eb + db + sb);
    uint8_t* expanded = buf;
    uint8_t* mid = buf + eb;
    uint8_t* scratch = buf + eb + db;
    const auto& ke = native::gemm_kernels(expand.g);
    const auto& kp = native::gemm_kernels(project.g);
    const int64_t expand_panels = kernels::gemm_num_panels(expand.w.N);
    const int64_t project_panels = kernels::gemm_num_panels(project.w.N);
    int64_t held_image = -1, held_lo = 0, held_hi = -1;  // the expanded rows [held_lo, held_hi] of held_image
    bool rings = false;
    for (int64_t r0 = begin; r0 < end;) {
      const int64_t n = r0 / OH, oh0 = r0 % OH;
      const int64_t r1 = std::min({end, (n + 1) * OH, r0 + tile_rows});
      const int64_t oh1 = oh0 + (r1 - r0);
      if (has_expand) {
        const int64_t lo = first_input_row(oh0), hi = last_input_row(oh1 - 1);
        int64_t next = lo;  // the first row to expand
        if (held_image == n && held_hi >= lo && held_lo <= lo) {
          const int64_t keep = held_hi - lo + 1;
          std::memmove(expanded, expanded + (lo - held_lo) * W * Cmid, static_cast<size_t>(keep * W * Cmid));
          next = held_hi + 1;
        }
        if (next <= hi) {
          GemmArgs g = expand.g;
          g.M = (hi - next + 1) * W;
          g.a = x + (n * H + next) * W * Cin;
          g.out = expanded + (next - lo) * W * Cmid;
          ke.gemm(g, 0, g.M, 0, expand_panels);
        }
        held_image = n, held_lo = lo, held_hi = hi;
        d.x = expanded;
        d.x_row0 = n * H + lo;
      }
      d.epi.out = mid;
      d.out_pixel0 = r0 * OW;
      d.keep_rings = rings;
      dw_kernel->rows(d, r0, r1, scratch);
      rings = true;
      GemmArgs g = project.g;
      g.M = (r1 - r0) * OW;
      g.a = mid;
      g.a_cached = true;
      g.out = y + r0 * OW * Cout * y_elem;
      if (accum != nullptr) g.r = accum + r0 * OW * Cout;
      kp.gemm(g, 0, g.M, 0, project_panels);
      r0 = r1;
    }
  }
};

at::Tensor native_inverted_residual(
    const at::Tensor& x, double x_scale, int64_t x_zero_point,
    const std::optional<at::Tensor>& expand_w, const std::optional<at::Tensor>& expand_scales,
    const std::optional<at::Tensor>& expand_bias, double expand_scale, int64_t expand_zero_point,
    at::ScalarType expand_dtype, const std::string& expand_post_op,
    const at::Tensor& dw_w, const at::Tensor& dw_scales, const std::optional<at::Tensor>& dw_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, double dw_scale,
    int64_t dw_zero_point, at::ScalarType dw_dtype, const std::string& dw_post_op,
    const at::Tensor& project_w, const at::Tensor& project_scales, const std::optional<at::Tensor>& project_bias,
    double output_scale, int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
    const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point) {
  checks::activation(x, x_scale, x_zero_point);
  TORCH_CHECK_VALUE(x.dim() == 4, "x must be 4-D [N, C, H, W] (channels-last memory preferred), got shape ",
                    x.sizes());
  native::gemm_kernels();  // raises on a CPU without the GEMM kernels (AVX2)
  Block b;
  b.dw_kernel = &native::depthwise_kernel();
  b.N = x.size(0), b.Cin = x.size(1), b.H = x.size(2), b.W = x.size(3);
  b.has_expand = expand_w.has_value() && expand_w->defined();
  TORCH_CHECK_VALUE(b.has_expand || !(expand_scales.has_value() && expand_scales->defined()),
                    "expand_scales given without expand_w");
  StageTensors et;
  at::ScalarType mid_in_dtype = x.scalar_type();
  int64_t mid_in_zp = x_zero_point;
  double mid_in_scale = x_scale;
  if (b.has_expand) {
    TORCH_CHECK_VALUE(expand_scales.has_value() && expand_scales->defined(), "expand_w needs expand_scales");
    b.expand.w = unpack_1x1(*expand_w, "expand_w", b.Cin);
    et = stage_tensors(*expand_scales, expand_bias, b.expand.w.N, "expand_scales", "expand_bias");
    check_stage_output(expand_scale, expand_zero_point, expand_dtype, "expand_scale", "expand_zero_point",
                       "expand_dtype");
    b.expand.g = native::gemm_args(b.expand.w, x.scalar_type(), x_zero_point, x_scale, et.scales, et.bias,
                                   checks::post_op(expand_post_op), expand_dtype, expand_scale, expand_zero_point);
    b.expand.g.lda = b.Cin;
    b.expand.g.ldc = b.expand.w.N;
    b.Cmid = b.expand.w.N;
    mid_in_dtype = expand_dtype, mid_in_zp = expand_zero_point, mid_in_scale = expand_scale;
  } else {
    b.Cmid = b.Cin;
  }
  const Conv2dParams p = conv2d_params(stride, padding, dilation, b.Cmid);
  const native::DepthwiseView dv = native::unpack_depthwise(dw_w, "dw_w");
  TORCH_CHECK_VALUE(dv.C == b.Cmid, "dw_w is a depthwise weight for ", dv.C, " channels, but the stage before gives ",
                    b.Cmid);
  TORCH_CHECK_VALUE((dv.KH - 1) * p.dilation[0] + 1 <= 256, "the native depthwise conv takes a dilated kernel height "
                    "of at most 256 rows");
  const auto o = check_conv_hw(b.H, b.W, dv.KH, dv.KW, p, "x");
  b.OH = o[0], b.OW = o[1];
  const StageTensors dt = stage_tensors(dw_scales, dw_bias, b.Cmid, "dw_scales", "dw_bias");
  check_stage_output(dw_scale, dw_zero_point, dw_dtype, "dw_scale", "dw_zero_point", "dw_dtype");
  b.project.w = unpack_1x1(project_w, "project_w", b.Cmid);
  b.Cout = b.project.w.N;
  const StageTensors pt = stage_tensors(project_scales, project_bias, b.Cout, "project_scales", "project_bias");
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const std::vector<int64_t> shape{b.N, b.Cout, b.OH, b.OW};
  check_accum(accum, accum_scale, accum_zero_point, shape);

  at::Tensor y = runtime::empty_output(
      shape, at::TensorOptions().dtype(output_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  const at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const bool has_accum = accum.has_value() && accum->defined();
  const at::Tensor r = has_accum ? accum->contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
  b.x = static_cast<const uint8_t*>(xc.const_data_ptr());
  b.accum = has_accum ? static_cast<const uint8_t*>(r.const_data_ptr()) : nullptr;
  b.y = static_cast<uint8_t*>(y.data_ptr());
  b.y_elem = static_cast<int64_t>(y.element_size());

  kernels::DepthwiseArgs& a = b.dw;
  a.x = b.x;
  a.x_int8 = mid_in_dtype == at::kChar;
  a.x_zp = static_cast<int32_t>(mid_in_zp);
  a.N = b.N, a.C = b.Cmid, a.H = b.H, a.W = b.W, a.OH = b.OH, a.OW = b.OW, a.KH = dv.KH, a.KW = dv.KW;
  a.sh = p.stride[0], a.sw = p.stride[1], a.ph = p.padding[0], a.pw = p.padding[1];
  a.dh = p.dilation[0], a.dw = p.dilation[1];
  a.epi = native::gemm_args(native::PackedView{}, mid_in_dtype, mid_in_zp, mid_in_scale, dt.scales, dt.bias,
                            checks::post_op(dw_post_op), dw_dtype, dw_scale, dw_zero_point);
  native::bind_depthwise(a, dv);

  b.project.g = native::gemm_args(b.project.w, dw_dtype, dw_zero_point, dw_scale, pt.scales, pt.bias,
                                  checks::post_op(post_op), output_dtype, output_scale, output_zero_point);
  b.project.g.lda = b.Cmid;
  b.project.g.ldc = b.Cout;
  b.project.g.r_int8 = has_accum && r.scalar_type() == at::kChar;
  b.project.g.r_zp = static_cast<int32_t>(accum_zero_point);
  b.project.g.r_scale = static_cast<float>(accum_scale);
  b.project.g.ldr = b.Cout;

  const int64_t row_bytes = ((b.has_expand ? a.sh * b.W : 0) + b.OW) * b.Cmid;
  b.tile_rows = std::clamp<int64_t>(kTileBytes / std::max<int64_t>(1, row_bytes), 1, b.OH);

  const int64_t rows = b.N * b.OH;
  const int64_t work = rows * b.OW * b.Cmid * (a.KH * a.KW + b.Cout) + (b.has_expand ? b.N * b.H * b.W * b.Cin * b.Cmid : 0);
  const int threads = at::get_num_threads();
  if (work < kParallelWork || threads <= 1) {
    b.rows(0, rows);
    return y;
  }
  // Whole images per thread where there are enough (no input row expanded twice), else rows.
  const int64_t per_unit = b.N >= threads ? b.OH : 1;
  parallel::parallel_for(0, rows / per_unit, 1, [&](int64_t begin, int64_t end) {
    b.rows(begin * per_unit, end * per_unit);
  });
  return y;
}

}  // namespace

void register_native_inverted_residual(torch::Library& m) {
  impl_each(m, "native_inverted_residual", &native_inverted_residual);
}

}  // namespace qbackend
