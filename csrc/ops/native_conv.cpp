// The native provider for 1x1 convolutions (groups 1, no padding, any stride): a GEMM over the
// channels-last pixels with qbackend's own int8 kernel (csrc/kernels/gemm_*), the residual add and
// relu fused in its epilogue. Other convolutions are not this provider's: the router sends them
// elsewhere, and these ops refuse them with a ValueError.
//
// Ops (torch.ops.qbackend):
//   native_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor
//   native_conv2d(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
//                 output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
//                 accum_zero_point) -> Tensor                                  (channels-last output)
//   native_conv2d_add_(... the same, Tensor(a!) accum ...) -> ()   the result written into accum
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "ops/checks.h"
#include "ops/conv_params.h"
#include "ops/native_gemm.h"
#include "runtime/parallel.h"

namespace qbackend {
namespace {

using kernels::GemmArgs;

void check_geometry(const Conv2dParams& p, int64_t KH, int64_t KW) {
  TORCH_CHECK_VALUE(KH == 1 && KW == 1 && p.groups == 1 && p.padding[0] == 0 && p.padding[1] == 0,
                    "the native provider runs 1x1 convolutions with groups 1 and no padding; got a ", KH, "x", KW,
                    " kernel, groups ", p.groups, ", padding ", p.padding[0], "x", p.padding[1],
                    ": use the onednn or fbgemm provider");
}

at::Tensor native_conv2d_prepack(const at::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation, int64_t groups) {
  check_conv_weight(weight, groups);
  check_geometry(conv2d_params(stride, padding, dilation, groups), weight.size(2), weight.size(3));
  return native::pack(weight.reshape({weight.size(0), weight.size(1)}).contiguous());
}

// What the checks established, for the kernel call.
struct Checked {
  std::vector<int64_t> shape;  // the output's [N, OC, OH, OW]
  native::PackedView w;
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

  GemmArgs g = native::gemm_args(w, x.scalar_type(), x_zero_point, x_scale, ws, b, c.op, output_dtype, output_scale,
                                 output_zero_point);
  g.r_int8 = has_accum && r.scalar_type() == at::kChar;
  g.r_zp = static_cast<int32_t>(accum_zero_point);
  g.r_scale = static_cast<float>(accum_scale);
  g.ldr = w.N;
  const uint8_t* xp = static_cast<const uint8_t*>(xc.const_data_ptr());
  const uint8_t* rp = has_accum ? static_cast<const uint8_t*>(r.const_data_ptr()) : nullptr;
  uint8_t* yp = static_cast<uint8_t*>(y.data_ptr());
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
  // them as in the unstrided case (one GEMM per output row read it OH times per image: ResNet-50's
  // 2048 x 1024 downsample at 7x7 ran at 0.87x of oneDNN that way).
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
  const native::PackedView w = native::unpack(w_packed, "w_packed");
  check_geometry(p, 1, 1);
  const auto o = check_conv_input(x, w.K, 1, 1, p);
  checks::scales(w_scales, w.N, "w_scales");
  checks::bias(bias, w.N);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  Checked c{{x.size(0), w.N, o[0], o[1]}, w, p, checks::post_op(post_op)};
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
  at::Tensor y =
      at::empty(c.shape, at::TensorOptions().dtype(output_dtype).memory_format(at::MemoryFormat::ChannelsLast));
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

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("native_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor");
  m.def(
      "native_conv2d(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, Tensor? bias, "
      "int[] stride, int[] padding, int[] dilation, int groups, float output_scale, int output_zero_point, "
      "ScalarType output_dtype, str post_op, Tensor? accum=None, float accum_scale=1.0, "
      "int accum_zero_point=0) -> Tensor");
  m.def(
      "native_conv2d_add_(Tensor x, float x_scale, int x_zero_point, Tensor w_packed, Tensor w_scales, Tensor? bias, "
      "int[] stride, int[] padding, int[] dilation, int groups, float output_scale, int output_zero_point, "
      "ScalarType output_dtype, str post_op, Tensor(a!) accum, float accum_scale, int accum_zero_point) -> ()");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("native_conv2d_prepack", &native_conv2d_prepack);
  m.impl("native_conv2d", &native_conv2d);
  m.impl("native_conv2d_add_", &native_conv2d_add_);
}
TORCH_LIBRARY_IMPL(qbackend, MkldnnCPU, m) {
  m.impl("native_conv2d_prepack", &native_conv2d_prepack);
  m.impl("native_conv2d", &native_conv2d);
  m.impl("native_conv2d_add_", &native_conv2d_add_);
}

}  // namespace qbackend
