// The fbgemm provider for Conv2d: fbgemmConv (its depthwise, groupwise, pointwise and im2col paths)
// with ReQuantizeOutput for uint8/int8 output, and FBGEMM's im2col GEMM (PackAWithIm2Col x
// PackBMatrix) with ReQuantizeForFloat for fp32/bf16 output, on plain channels-last tensors.
//
// Ops (torch.ops.qbackend):
//   fbgemm_conv2d_prepack(Tensor weight, int[] stride, int[] padding, int[] dilation, int groups)
//   fbgemm_conv2d(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
//                 output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale, accum_zero_point)
// The stride/padding/dilation/groups are fixed at prepack (FBGEMM packs for them); the op takes
// them again (same signature as onednn_conv2d, and shape inference needs them) and checks them.
// Not fused by FBGEMM, so run after an fp32 output: gelu, bf16 output, and the residual add.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/conv2d.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <fbgemm/Fbgemm.h>

#include <mutex>

#include "common/checks.h"
#include "common/conv_params.h"
#include "common/epilogue.h"
#include "providers/fbgemm_requant.h"
#include "common/opaque_handle.h"
#include "common/saturation.h"
#include "runtime/parallel.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

constexpr const char* kWhat = "FBGEMM conv2d weight (qbackend.fbgemm_conv2d_prepack)";

struct FbgemmConvWeight {
  int64_t OC = 0, IC = 0, KH = 0, KW = 0;
  Conv2dParams p;
  at::Tensor w_krsc;  // int8 [OC, KH, KW, IC/G]: FBGEMM's layout, also the handle's bytes
  std::vector<int32_t> col_offsets;    // per output channel: sum of its weights
  std::vector<int32_t> w_zero_points;  // all 0
  std::unique_ptr<fbgemm::PackWeightsForConv<2>> packed;
  bool depthwise = false;  // fbgemmConv takes its depthwise path (16-bit intermediates, see below)
  std::once_flag im2col_once;  // the im2col B matrix, packed on first fp32-output call
  std::unique_ptr<fbgemm::PackBMatrix<int8_t>> im2col;
  std::once_flag float_once;  // the weight as fp32 [OC, IC/G, KH, KW], for the exact depthwise route
  at::Tensor w_float;

  // Depthwise-like convs whose int32 sums stay below 2^24 (|x - zp| <= 255, |w| <= 128) can be
  // computed exactly as an fp32 conv of the integers: every partial sum is an exactly representable
  // integer whatever the summation order.
  bool exact_in_fp32() const { return depthwise && KH * KW * (IC / p.groups) * 255 * 128 < (int64_t(1) << 24); }

  const at::Tensor& float_weight() {
    std::call_once(float_once, [&] { w_float = w_krsc.permute({0, 3, 1, 2}).to(at::kFloat).contiguous(); });
    return w_float;
  }

  fbgemm::conv_param_t<2> conv_param(int64_t N, int64_t H, int64_t W) const {
    return fbgemm::conv_param_t<2>(
        static_cast<int>(N), static_cast<int>(IC), static_cast<int>(OC), {static_cast<int>(H), static_cast<int>(W)},
        static_cast<int>(p.groups), {static_cast<int>(KH), static_cast<int>(KW)},
        {static_cast<int>(p.stride[0]), static_cast<int>(p.stride[1])},
        {static_cast<int>(p.padding[0]), static_cast<int>(p.padding[1]), static_cast<int>(p.padding[0]),
         static_cast<int>(p.padding[1])},
        {static_cast<int>(p.dilation[0]), static_cast<int>(p.dilation[1])});
  }

  fbgemm::PackBMatrix<int8_t>& im2col_weight() {
    std::call_once(im2col_once, [&] {
      const int k_per_group = static_cast<int>(KH * KW * IC / p.groups);
      im2col = std::make_unique<fbgemm::PackBMatrix<int8_t>>(
          // B is (K per group * G) x (OC / G): FBGEMM's grouped PackBMatrix takes per-group columns.
          fbgemm::matrix_op_t::Transpose, k_per_group * static_cast<int>(p.groups), static_cast<int>(OC / p.groups),
          w_krsc.data_ptr<int8_t>(), k_per_group, nullptr, static_cast<int>(p.groups));
    });
    return *im2col;
  }
};

at::Tensor fbgemm_conv2d_prepack(const at::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation, int64_t groups) {
  const Conv2dParams p = conv2d_params(stride, padding, dilation, groups);
  check_conv_weight(weight, groups);
  auto h = std::make_unique<FbgemmConvWeight>();
  h->p = p;
  h->OC = weight.size(0);
  h->IC = weight.size(1) * groups;
  h->KH = weight.size(2);
  h->KW = weight.size(3);
  h->w_krsc = weight.permute({0, 2, 3, 1}).contiguous();
  const int64_t per_oc = h->KH * h->KW * weight.size(1);
  const int8_t* wp = h->w_krsc.data_ptr<int8_t>();
  h->col_offsets.resize(h->OC);
  for (int64_t oc = 0; oc < h->OC; ++oc) {
    int32_t s = 0;
    for (int64_t i = 0; i < per_oc; ++i) s += wp[oc * per_oc + i];
    h->col_offsets[oc] = s;
  }
  h->w_zero_points.assign(h->OC, 0);
  // The packing depends on channels, kernel, stride, padding, dilation and groups, not on the
  // batch or image size: pack for a nominal input just large enough for one output pixel.
  const int64_t H = (h->KH - 1) * p.dilation[0] + 1, W = (h->KW - 1) * p.dilation[1] + 1;
  const auto nominal = h->conv_param(1, H + 8, W + 8);
  h->packed = std::make_unique<fbgemm::PackWeightsForConv<2>>(nominal, wp);
  h->depthwise = fbgemm::ConvFastPath<2, int32_t>(nominal) == fbgemm::optimized_conv_t::depthwise;
  // The handle's bytes are the KRSC int8 weight, shaped [OC, KH, KW, IC/G] so that shape
  // inference (the fake op) can read the geometry from it.
  void* data = h->w_krsc.data_ptr();
  const std::vector<int64_t> sizes = h->w_krsc.sizes().vec();
  return wrap_opaque(std::move(h), data, sizes);
}

struct U8Image {
  at::Tensor t;  // uint8, channels-last contiguous
  int32_t zp;
};

U8Image as_u8_nhwc(const at::Tensor& x, int64_t zp) {
  at::Tensor c = x.contiguous(at::MemoryFormat::ChannelsLast);
  if (x.scalar_type() == at::kByte) return {c, static_cast<int32_t>(zp)};
  return {shift_int8_to_uint8(c), static_cast<int32_t>(zp + 128)};
}

// A second thread pays off from about 100 us of work on one. Depthwise convs do about 16x less
// arithmetic per byte than GEMM-like ones, so their multiply-adds count 16x
// (benchmarks/results/design_measurements.md, "FBGEMM threading thresholds").
int num_tasks_for(int64_t macs, bool depthwise) {
  return (depthwise ? macs * 16 : macs) < (int64_t(1) << 22) ? 1 : at::get_num_threads();
}

template <bool RELU>
void conv_u8(FbgemmConvWeight& w, const fbgemm::conv_param_t<2>& cp, const U8Image& x, const float* multiplier,
             const float* act_times_w, int32_t out_zp, const float* bias, uint8_t* out, int64_t out_pixels) {
  at::Tensor acc = at::empty({out_pixels * w.OC}, at::kInt);
  const int num_tasks = num_tasks_for(out_pixels * w.OC * w.KH * w.KW * w.IC / w.p.groups, w.depthwise);
  parallel::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      fbgemm::DoNothing<> nothing;
      fbgemm::ReQuantizeOutput<RELU, fbgemm::QuantizationGranularity::OUT_CHANNEL, float> proc(
          nothing, multiplier, out_zp, x.zp, w.w_zero_points.data(), nullptr, w.col_offsets.data(), bias,
          static_cast<uint32_t>(w.OC), static_cast<int>(w.p.groups), act_times_w);
      fbgemm::fbgemmConv(cp, x.t.data_ptr<uint8_t>(), *w.packed, out, acc.data_ptr<int32_t>(), proc,
                         static_cast<int>(task), num_tasks);
    }
  });
}

template <bool RELU>
void conv_f32(FbgemmConvWeight& w, const fbgemm::conv_param_t<2>& cp, const U8Image& x, float x_scale,
              const float* w_scales, const float* bias, float* out, int64_t out_pixels) {
  fbgemm::PackBMatrix<int8_t>& B = w.im2col_weight();
  const int num_tasks = num_tasks_for(out_pixels * w.OC * w.KH * w.KW * w.IC / w.p.groups, w.depthwise);
  parallel::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> row_offsets(fbgemm::PackAWithIm2Col<uint8_t, int32_t, 2>::rowOffsetBufferSize());
    for (int64_t task = begin; task < end; ++task) {
      fbgemm::PackAWithIm2Col<uint8_t, int32_t, 2> packA(cp, x.t.data_ptr<uint8_t>(), nullptr, x.zp,
                                                         row_offsets.data(), /*b_symmetric=*/true);
      fbgemm::DoNothing<float, float> nothing;
      fbgemm::ReQuantizeForFloat<RELU, fbgemm::QuantizationGranularity::OUT_CHANNEL> proc(
          nothing, x_scale, w_scales, x.zp, w.w_zero_points.data(), packA.getRowOffsetBuffer(),
          w.col_offsets.data(), bias, static_cast<uint32_t>(w.OC), static_cast<int>(w.p.groups));
      fbgemm::fbgemmPacked(packA, B, out, reinterpret_cast<int32_t*>(out), static_cast<uint32_t>(w.OC), proc,
                           static_cast<int>(task), num_tasks);
    }
  });
}

// The exact depthwise route (see exact_in_fp32): y = fp32conv(x - zp, w) * x_scale * w_scale + bias.
at::Tensor depthwise_f32(FbgemmConvWeight& w, const U8Image& x, double x_scale, const at::Tensor& w_scales,
                         const at::Tensor& bias, bool relu) {
  const at::Tensor xf = x.t.to(at::kFloat).sub_(static_cast<float>(x.zp));  // keeps channels-last
  at::Tensor acc = at::conv2d(xf, w.float_weight(), {}, {w.p.stride[0], w.p.stride[1]},
                              {w.p.padding[0], w.p.padding[1]}, {w.p.dilation[0], w.p.dilation[1]}, w.p.groups);
  at::Tensor y = acc.mul_((w_scales * static_cast<float>(x_scale)).view({1, -1, 1, 1}));
  if (bias.defined()) y.add_(bias.view({1, -1, 1, 1}));
  if (relu) y.relu_();
  return y.contiguous(at::MemoryFormat::ChannelsLast);
}

at::Tensor fbgemm_conv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                         at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, double output_scale,
                         int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
                         const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point) {
  checks::activation(x, x_scale, x_zero_point);
  FbgemmConvWeight& w = unwrap_opaque<FbgemmConvWeight>(w_packed, "w_packed", kWhat);
  const Conv2dParams given = conv2d_params(stride, padding, dilation, groups);
  TORCH_CHECK_VALUE(given.stride == w.p.stride && given.padding == w.p.padding && given.dilation == w.p.dilation &&
                        given.groups == w.p.groups,
                    "stride/padding/dilation/groups must be those w_packed was packed with (stride ",
                    at::IntArrayRef(w.p.stride), ", padding ", at::IntArrayRef(w.p.padding), ", dilation ",
                    at::IntArrayRef(w.p.dilation), ", groups ", w.p.groups, ")");
  const auto o = check_conv_input(x, w.IC, w.KH, w.KW, w.p);
  checks::scales(w_scales, w.OC, "w_scales");
  checks::bias(bias, w.OC);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const checks::PostOp op = checks::post_op(post_op);
  const int64_t N = x.size(0);
  const std::vector<int64_t> shape{N, w.OC, o[0], o[1]};
  check_accum(accum, accum_scale, accum_zero_point, shape);
  const auto cl = at::TensorOptions().memory_format(at::MemoryFormat::ChannelsLast);
  if (N == 0 || x.size(2) == 0 || x.size(3) == 0) return at::empty(shape, cl.dtype(output_dtype));
  TORCH_CHECK_VALUE(N < (1 << 30) && x.numel() < (int64_t(1) << 31), "x is too large for FBGEMM (int32 sizes)");

  // Padding holds the activation zero point, so it must fit in 7 bits too where x must.
  const bool padded = w.p.padding[0] > 0 || w.p.padding[1] > 0;
  if (!saturation::fbgemm_has_vnni()) {
    saturation::require_7bit(x, "FBGEMM");
    TORCH_CHECK_VALUE(!padded || x_zero_point <= 127, "x_zero_point must be <= 127 for a padded conv on this CPU "
                      "(or QBACKEND_ISA): without VNNI the padding, which holds the zero point, saturates FBGEMM's "
                      "u8 x s8 products; got ", x_zero_point);
  }
  const U8Image xu = as_u8_nhwc(x, x_zero_point);
  const auto cp = w.conv_param(N, x.size(2), x.size(3));
  const int64_t pixels = N * o[0] * o[1];
  const at::Tensor ws = w_scales.contiguous();
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const bool has_accum = accum.has_value() && accum->defined();

  // FBGEMM's depthwise kernel overflows 16-bit intermediates on 8-bit activations even with VNNI,
  // and more so when the padding's zero point is >= 128: such inputs take an exact route below (an
  // fp32 conv of the integers; FBGEMM's im2col GEMM is exact too, but one GEMM per channel, far
  // slower: benchmarks/results/design_measurements.md, "FBGEMM depthwise overflow").
  const bool fast_ok = !w.depthwise || (saturation::fits_7_bits(xu.t) && (!padded || xu.zp <= 127));
  if (fast_ok && checks::is_int8_type(output_dtype) && op != checks::PostOp::gelu && !has_accum) {
    const FbgemmRequant rq(x_scale, ws, output_scale, output_zero_point, output_dtype);
    if (rq.fits(w.KH * w.KW * (w.IC / w.p.groups), bp)) {
      at::Tensor y = at::empty(shape, cl.dtype(at::kByte));
      if (op == checks::PostOp::relu)
        conv_u8<true>(w, cp, xu, rq.multiplier.data(), rq.act_times_w.data(), rq.zero_point, bp, y.data_ptr<uint8_t>(),
                      pixels);
      else
        conv_u8<false>(w, cp, xu, rq.multiplier.data(), rq.act_times_w.data(), rq.zero_point, bp, y.data_ptr<uint8_t>(),
                       pixels);
      return output_dtype == at::kChar ? shift_uint8_to_int8_(y) : y;
    }
  }
  at::Tensor y;
  const bool fuse_relu = op == checks::PostOp::relu && !has_accum;
  if (w.exact_in_fp32()) {
    y = depthwise_f32(w, xu, x_scale, ws, b, fuse_relu);
  } else {
    y = at::empty(shape, cl.dtype(at::kFloat));
    if (fuse_relu) conv_f32<true>(w, cp, xu, static_cast<float>(x_scale), ws.data_ptr<float>(), bp, y.data_ptr<float>(), pixels);
    else conv_f32<false>(w, cp, xu, static_cast<float>(x_scale), ws.data_ptr<float>(), bp, y.data_ptr<float>(), pixels);
  }
  if (has_accum) y = add_accum(y, *accum, accum_scale, accum_zero_point, op == checks::PostOp::relu);
  if (op == checks::PostOp::gelu) y = at::gelu(y);
  return finish_from_float(y, output_scale, output_zero_point, output_dtype);
}

}  // namespace

// The schemas: providers/registrations.cpp.
void register_fbgemm_conv2d(torch::Library& m) {
  impl_each(m, "fbgemm_conv2d_prepack", &fbgemm_conv2d_prepack,
            "fbgemm_conv2d", &fbgemm_conv2d);
}

}  // namespace qbackend
