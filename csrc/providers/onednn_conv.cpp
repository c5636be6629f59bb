// The onednn provider for Conv2d: torch's plain-tensor oneDNN ops (onednn::qconv_prepack,
// onednn::qconv2d_pointwise and its .binary overload for the fused residual sum).
//
// Ops (torch.ops.qbackend):
//   onednn_conv2d_prepack(Tensor weight, Tensor w_scales, int[] stride, int[] padding, int[] dilation,
//                         int groups, int[]? x_shape=None) -> Tensor      (an opaque mkldnn tensor)
//   onednn_conv2d(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
//                 output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
//                 accum_zero_point) -> Tensor
//   onednn_conv2d_add_(... the same, Tensor(a!) accum ...) -> (): the residual conv writing into accum
// oneDNN fuses relu and the sum (when the output dtype equals accum's); onednn_conv2d copies the
// accum tensor first because oneDNN writes its result into it (onednn_conv2d_add_, for an accum
// nothing reads afterwards, does not). gelu (which torch's qconv does not take) and other residual
// cases run unfused after an fp32 output.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/relu.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/conv_params.h"
#include "common/epilogue.h"
#include "common/saturation.h"
#include "providers/registrations.h"

namespace qbackend {
namespace {

using ScalarList = c10::List<std::optional<at::Scalar>>;

using PointwiseFn = at::Tensor(at::Tensor, double, int64_t, at::Tensor, at::Tensor, at::Tensor,
                               std::optional<at::Tensor>, c10::List<int64_t>, c10::List<int64_t>,
                               c10::List<int64_t>, int64_t, double, int64_t, std::optional<at::ScalarType>,
                               c10::string_view, ScalarList, std::optional<c10::string_view>);
using BinaryFn = at::Tensor(at::Tensor, double, int64_t, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            std::optional<at::Tensor>, c10::List<int64_t>, c10::List<int64_t>, c10::List<int64_t>,
                            int64_t, double, int64_t, std::optional<at::ScalarType>, double, int64_t,
                            c10::string_view, std::optional<at::Scalar>, std::optional<c10::string_view>,
                            ScalarList, std::optional<c10::string_view>);

// oneDNN 3.12 computes wrong results (hundreds of LSB, even with zero point 0) for depthwise convs
// with a channel multiplier > 1 and unequal strides (e.g. kernel 1x5, stride (1, 2), output width
// 1; measured). The provider refuses that configuration (the fbgemm provider takes it) rather than
// return wrong numbers.
void refuse_known_bad(int64_t in_channels, int64_t out_channels, const Conv2dParams& p) {
  const bool depthwise_multiplier = p.groups == in_channels && out_channels > in_channels;
  TORCH_CHECK_VALUE(!(depthwise_multiplier && p.stride[0] != p.stride[1]),
                    "the onednn provider does not run depthwise convs with a channel multiplier and unequal strides "
                    "(stride ", at::IntArrayRef(p.stride), "): oneDNN computes them wrongly; use the fbgemm provider");
}

at::Tensor onednn_conv2d_prepack(const at::Tensor& weight, const at::Tensor& w_scales, at::IntArrayRef stride,
                                 at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                 at::OptionalIntArrayRef x_shape, double x_scale, int64_t x_zero_point) {
  const Conv2dParams p = conv2d_params(stride, padding, dilation, groups);
  check_conv_weight(weight, groups);
  checks::scales(w_scales, weight.size(0), "w_scales");
  refuse_known_bad(weight.size(1) * groups, weight.size(0), p);
  using PrepackFn = at::Tensor(at::Tensor, at::Tensor, double, int64_t, c10::List<int64_t>, c10::List<int64_t>,
                               c10::List<int64_t>, int64_t, std::optional<c10::List<int64_t>>);
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qconv_prepack", "").typed<PrepackFn>();
  std::optional<c10::List<int64_t>> shape;
  if (x_shape.has_value()) {
    TORCH_CHECK_VALUE(x_shape->size() == 4 && (*x_shape)[0] >= 1 && (*x_shape)[1] == weight.size(1) * groups,
                      "x_shape must be [N, C, H, W] with N >= 1 and C = ", weight.size(1) * groups, ", got ",
                      *x_shape);
    check_conv_hw((*x_shape)[2], (*x_shape)[3], weight.size(2), weight.size(3), p, "x_shape");
    shape = c10::List<int64_t>(x_shape->vec());
  }
  // x_scale / x_zero_point are not baked into the values (the tests run other qparams on the same
  // packing), but they choose the weight format: packed for zero point 0 and run with another (or
  // the reverse), oneDNN reorders the whole weight on every call (benchmarks/results/
  // design_measurements.md, "oneDNN conv weight format"). Pass the activation qparams the layer
  // will run with.
  checks::scale(x_scale, "x_scale");
  checks::zero_point(x_zero_point, at::kByte, "x_zero_point");
  return op.call(weight.contiguous(), w_scales.contiguous(), x_scale, x_zero_point,
                 c10::List<int64_t>({p.stride[0], p.stride[1]}), c10::List<int64_t>({p.padding[0], p.padding[1]}),
                 c10::List<int64_t>({p.dilation[0], p.dilation[1]}), groups, shape);
}

const char* post_op_name(checks::PostOp op) {
  return op == checks::PostOp::relu ? "relu" : op == checks::PostOp::gelu ? "gelu" : "none";
}

// donated: the caller gives up `accum` (onednn_conv2d_add_): oneDNN's sum post-op writes the result
// into it directly instead of into a copy.
at::Tensor conv2d_impl(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                       const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, double output_scale,
                       int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
                       const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point,
                       bool donated, bool* wrote_accum = nullptr) {
  checks::activation(x, x_scale, x_zero_point);
  const Conv2dParams p = conv2d_params(stride, padding, dilation, groups);
  TORCH_CHECK_VALUE(w_packed.defined() && w_packed.is_mkldnn() && w_packed.scalar_type() == at::kChar &&
                        w_packed.dim() == 4,
                    "w_packed must be a oneDNN conv2d weight from qbackend.onednn_conv2d_prepack");
  // The packed weight keeps the logical shape [OC, IC/groups, KH, KW].
  const int64_t OC = w_packed.size(0), KH = w_packed.size(2), KW = w_packed.size(3);
  TORCH_CHECK_VALUE(OC % groups == 0, "groups (", groups, ") does not divide the packed weight's ", OC,
                    " output channels: pass the groups it was packed with");
  const auto o = check_conv_input(x, w_packed.size(1) * groups, KH, KW, p);
  refuse_known_bad(w_packed.size(1) * groups, OC, p);
  checks::scales(w_scales, OC, "w_scales");
  checks::bias(bias, OC);
  checks::output_qparams(output_scale, output_zero_point, output_dtype);
  const checks::PostOp op = checks::post_op(post_op);
  const int64_t N = x.size(0);
  const std::vector<int64_t> shape{N, OC, o[0], o[1]};
  check_accum(accum, accum_scale, accum_zero_point, shape);
  const auto cl = at::TensorOptions().memory_format(at::MemoryFormat::ChannelsLast);
  if (N == 0 || x.size(2) == 0 || x.size(3) == 0) return at::empty(shape, cl.dtype(output_dtype));

  const bool depthwise = w_packed.size(1) == 1 && OC == groups && groups > 1;
  if (!saturation::onednn_exact_8bit(depthwise)) {
    saturation::require_7bit(x, "oneDNN");
    // the padding holds the zero point, and is multiplied like x
    TORCH_CHECK_VALUE((p.padding[0] == 0 && p.padding[1] == 0) || x_zero_point <= 127,
                      "x_zero_point must be at most 127 for a padded conv on this CPU (or QBACKEND_ISA): without "
                      "VNNI oneDNN saturates the products of the padding, which holds the zero point; got ",
                      x_zero_point);
  }
  // torch's oneDNN conv takes uint8 activations only: int8 ones are shifted by +128 (exact).
  at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  if (xc.scalar_type() == at::kChar) {
    xc = shift_int8_to_uint8(xc);
    x_zero_point += 128;
  }
  // oneDNN 3.12 gets the zero-point compensation wrong at the padded border of a depthwise conv
  // whose kernel is 1 along a padded dimension (kernel 1x3 with padding (1, 0); tests/ops/test_conv2d.py,
  // benchmarks/results/design_measurements.md, "oneDNN conv weight format"), and of convs padded past
  // "same" padding (more than ceil((k - 1) * dilation / 2) a side: wrong values with a nonzero zero
  // point, a segfault with zero point 0 where stride >= 2 output columns see only padding;
  // tests/ops/test_fuzz_findings.py). Such convs get their padding written out (filled with the
  // zero point, i.e. real zeros) and run unpadded. Rare in real models; exact; costs one copy.
  std::array<int64_t, 2> padding_used = p.padding;
  const bool unit_kernel_padded = (KH == 1 && p.padding[0] > 0) || (KW == 1 && p.padding[1] > 0);
  const bool past_same = p.padding[0] > ((KH - 1) * p.dilation[0] + 1) / 2 ||
                         p.padding[1] > ((KW - 1) * p.dilation[1] + 1) / 2;
  if ((unit_kernel_padded && x_zero_point != 0) || past_same) {
    xc = at::constant_pad_nd(xc, {p.padding[1], p.padding[1], p.padding[0], p.padding[0]}, x_zero_point)
             .contiguous(at::MemoryFormat::ChannelsLast);
    padding_used = {0, 0};
  }
  // oneDNN 3.12 computes wrong values for convs whose output is one column (row) with a stride >= 2
  // across it: depthwise and one-channel ones on AMD EPYC (1 channel, 9x6 input, kernel 5x5, stride
  // (1, 3)), dense ones too on an AMX Xeon (3 -> 2 channels, 9x5 input, kernel 5x5, stride (1, 2);
  // tests/ops/test_fuzz_findings.py). Every such conv runs on the input widened by one stride of
  // zero-point columns (rows): a second output column (row) appears and the first is unchanged;
  // the first is kept and the epilogue runs on fp32 (rare in real models; exact).
  const bool one_col = o[1] == 1 && p.stride[1] >= 2;
  const bool one_row = o[0] == 1 && p.stride[0] >= 2;
  if (one_col || one_row) {
    xc = at::constant_pad_nd(xc, {padding_used[1], padding_used[1] + (one_col ? p.stride[1] : 0), padding_used[0],
                                  padding_used[0] + (one_row ? p.stride[0] : 0)},
                             x_zero_point)
             .contiguous(at::MemoryFormat::ChannelsLast);
    padding_used = {0, 0};
  }
  const at::Tensor w_zp = at::zeros({OC}, at::kLong);
  const std::optional<at::Tensor> b =
      bias.has_value() && bias->defined() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  const c10::List<int64_t> s({p.stride[0], p.stride[1]}), pd({padding_used[0], padding_used[1]}),
      dl({p.dilation[0], p.dilation[1]});
  const bool int_out = checks::is_int8_type(output_dtype);
  const std::optional<at::ScalarType> dt(output_dtype);  // explicit: "none" means "the input's dtype"

  const bool has_accum = accum.has_value() && accum->defined();

  const bool fusable = op != checks::PostOp::gelu && !one_col && !one_row;
  if (fusable && has_accum && accum->scalar_type() == output_dtype) {
    static auto bin = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("onednn::qconv2d_pointwise", "binary")
                          .typed<BinaryFn>();
    const bool in_place = donated && accum->is_contiguous(at::MemoryFormat::ChannelsLast);
    if (wrote_accum != nullptr) *wrote_accum = in_place;  // oneDNN's sum writes the result into dst
    at::Tensor dst = in_place ? *accum
                              : accum->contiguous(at::MemoryFormat::ChannelsLast).clone(at::MemoryFormat::ChannelsLast);
    return bin.call(xc, x_scale, x_zero_point, w_packed, w_scales.contiguous(), w_zp, dst, b, s, pd, dl, groups,
                    output_scale, output_zero_point, dt, accum_scale, accum_zero_point, "sum", 1.0,
                    post_op_name(op), ScalarList(), "");
  }
  static auto pw =
      c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qconv2d_pointwise", "").typed<PointwiseFn>();
  if (fusable && !has_accum) {
    return pw.call(xc, x_scale, x_zero_point, w_packed, w_scales.contiguous(), w_zp, b, s, pd, dl, groups,
                   int_out ? output_scale : 1.0, int_out ? output_zero_point : 0, dt, post_op_name(op),
                   ScalarList(), "");
  }
  // gelu, a residual add whose dtype differs from the output's, or a widened input: fp32 conv, the
  // rest unfused.
  at::Tensor y = pw.call(xc, x_scale, x_zero_point, w_packed, w_scales.contiguous(), w_zp, b, s, pd, dl, groups,
                         1.0, 0, at::kFloat, "none", ScalarList(), "");
  if (one_col || one_row) y = y.narrow(2, 0, o[0]).narrow(3, 0, o[1]).contiguous(at::MemoryFormat::ChannelsLast);
  if (has_accum) y = add_accum(y, *accum, accum_scale, accum_zero_point, op == checks::PostOp::relu);
  else if (op == checks::PostOp::relu) y = at::relu(y);
  if (op == checks::PostOp::gelu) y = at::gelu(y);
  return finish_from_float(y, output_scale, output_zero_point, output_dtype);
}

at::Tensor onednn_conv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                         const at::Tensor& w_scales, const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                         at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, double output_scale,
                         int64_t output_zero_point, at::ScalarType output_dtype, const std::string& post_op,
                         const std::optional<at::Tensor>& accum, double accum_scale, int64_t accum_zero_point) {
  return conv2d_impl(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation, groups,
                     output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale, accum_zero_point,
                     /*donated=*/false);
}

// The residual conv with the accum given up: the result is written into accum (same shape and dtype
// as the output). It returns nothing (torch.compile functionalizes mutating custom ops only when
// they return no alias); the caller reads accum. Saves the copy of accum that onednn_conv2d makes to protect it.
void onednn_conv2d_add_(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& w_packed,
                               const at::Tensor& w_scales, const std::optional<at::Tensor>& bias,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               int64_t groups, double output_scale, int64_t output_zero_point,
                               at::ScalarType output_dtype, const std::string& post_op, at::Tensor& accum,
                               double accum_scale, int64_t accum_zero_point) {
  check_accum_does_not_alias(accum, x, w_packed, bias, "onednn_conv2d_add_");
  TORCH_CHECK_VALUE(accum.scalar_type() == output_dtype, "onednn_conv2d_add_ writes the result into accum, so accum "
                    "must have the output dtype (", checks::dtype_name(output_dtype), "), got ",
                    checks::dtype_name(accum.scalar_type()));
  bool wrote = false;
  const at::Tensor y = conv2d_impl(x, x_scale, x_zero_point, w_packed, w_scales, bias, stride, padding, dilation,
                                   groups, output_scale, output_zero_point, output_dtype, post_op, accum, accum_scale,
                                   accum_zero_point, /*donated=*/true, &wrote);
  // torch's binary op computes into accum (channels-last) and returns a copy of it; anything else
  // (gelu, a strided accum) was computed out of place: either way accum ends up holding y.
  if (!wrote) accum.copy_(y);
}

}  // namespace

// The schemas: providers/registrations.cpp.
void register_onednn_conv2d(torch::Library& m) {
  impl_each(m, "onednn_conv2d_prepack", &onednn_conv2d_prepack,
            "onednn_conv2d", &onednn_conv2d,
            "onednn_conv2d_add_", &onednn_conv2d_add_);
}

}  // namespace qbackend
