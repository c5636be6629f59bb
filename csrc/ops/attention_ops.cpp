// torch op qbackend::attention: scaled dot-product attention (no dropout) with the output's
// conversion fused, for the attention cores of transformer encoders.
//
//   attention(q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,Dv], mask?, scale, is_causal, out_dtype,
//             out_scale, out_zero_point) -> [B,H,Sq,Dv]
//
// = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, scale=scale, is_causal=...)
// in fp32 arithmetic, returned as float32 / bfloat16, or quantized to uint8/int8 with
// (out_scale, out_zero_point) exactly as qbackend::quantize_per_tensor quantizes the fp32 value.
// bf16_products: the two matrix products take bf16 operands (fp32 accumulation) where the CPU has
// AVX512-BF16 and runs its dot products faster than fp32 FMAs (qbackend::cpu::bf16_products_pay(),
// measured once: not on Intel's AVX512-BF16 cores); elsewhere the flag is ignored (fp32 products).
// q, k, v: float32 or bfloat16 (one dtype), any strides (a last dimension that is not contiguous
// is copied). mask: bool (true = attend) or float32/bfloat16 (added), broadcastable to
// [B,H,Sq,Sk]. The output is laid out as [B,Sq,H,Dv] (its transpose(1, 2) is contiguous), so the
// usual transpose + reshape back to [B,Sq,H*Dv] is a view.
//
// AVX512 kernel (csrc/kernels/attention_avx512.cpp) when qbackend::cpu::has(qbackend::cpu::Isa::Avx512);
// below that, ATen's SDPA in fp32, then the same output conversion.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/round.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/clamp.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

#include "cpu/bf16_speed.h"
#include "cpu/probe.h"
#include "kernels/attention_kernels.h"
#include "common/checks.h"
#include "runtime/parallel.h"

namespace qbackend::ops {
namespace {

using kernels::AttentionProblem;
using kernels::AttnIn;
using kernels::AttnMask;
using kernels::AttnOut;

constexpr int64_t kRowBlock = 8;  // the kernel's query rows per block

at::Tensor last_dim_dense(const at::Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

void check_qkv(const at::Tensor& t, const char* name, at::ScalarType dt) {
  checks::cpu(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
                   " must be float32 or bfloat16, got ", checks::dtype_name(t.scalar_type()));
  TORCH_CHECK_TYPE(t.scalar_type() == dt, name, " must have q's dtype ", checks::dtype_name(dt), ", got ",
                   checks::dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 4, name, " must be 4-D [batch, heads, sequence, head_dim], got shape ", t.sizes());
}

// The mask broadcast to [B,H,Sq,Sk] (a view; its last dimension made contiguous if it is not).
at::Tensor broadcast_mask(const at::Tensor& m, int64_t B, int64_t H, int64_t Sq, int64_t Sk) {
  checks::cpu(m, "mask");
  TORCH_CHECK_TYPE(m.scalar_type() == at::kBool || m.scalar_type() == at::kFloat || m.scalar_type() == at::kBFloat16,
                   "mask must be bool, float32 or bfloat16, got ", checks::dtype_name(m.scalar_type()));
  const int64_t want[4] = {B, H, Sq, Sk};
  bool ok = m.dim() <= 4;
  for (int64_t d = 0; ok && d < m.dim(); ++d) {
    const int64_t size = m.size(m.dim() - 1 - d), target = want[3 - d];
    ok = size == target || size == 1;
  }
  TORCH_CHECK_VALUE(ok, "mask of shape ", m.sizes(), " does not broadcast to [batch, heads, query, key] = [", B, ", ",
                    H, ", ", Sq, ", ", Sk, "]");
  return last_dim_dense(m.expand({B, H, Sq, Sk}));
}

AttnOut out_kind(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return AttnOut::f32;
    case at::kBFloat16: return AttnOut::bf16;
    case at::kByte: return AttnOut::u8;
    default: return AttnOut::s8;
  }
}

// Below AVX512: ATen's SDPA in fp32, then the output conversion.
void attention_fallback(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                        double scale, bool is_causal, double out_scale, int64_t out_zp, at::Tensor& out) {
  std::optional<at::Tensor> m = mask;
  if (m.has_value() && m->scalar_type() != at::kBool) m = m->to(at::kFloat);
  at::Tensor y = at::scaled_dot_product_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), m, 0.0,
                                                  is_causal, scale);
  if (checks::is_int8_type(out.scalar_type())) {
    const bool u8 = out.scalar_type() == at::kByte;
    const float s = static_cast<float>(out_scale);
    at::Tensor x = at::nan_to_num(y.to(at::kFloat).div(s), 0.0, INFINITY, -INFINITY);
    y = at::clamp(at::round(x) + double(out_zp), u8 ? 0 : -128, u8 ? 255 : 127);
  }
  out.copy_(y);
}

at::Tensor attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                     const std::optional<at::Tensor>& mask_in, double scale, bool is_causal, at::ScalarType out_dtype,
                     double out_scale, int64_t out_zero_point, bool bf16_products) {
  check_qkv(q_in, "q", q_in.scalar_type());
  check_qkv(k_in, "k", q_in.scalar_type());
  check_qkv(v_in, "v", q_in.scalar_type());
  const int64_t B = q_in.size(0), H = q_in.size(1), Sq = q_in.size(2), D = q_in.size(3);
  const int64_t Sk = k_in.size(2), Dv = v_in.size(3);
  TORCH_CHECK_VALUE(k_in.size(0) == B && v_in.size(0) == B && k_in.size(1) == H && v_in.size(1) == H,
                    "q, k and v must have the same batch and head sizes, got q ", q_in.sizes(), ", k ", k_in.sizes(),
                    ", v ", v_in.sizes());
  TORCH_CHECK_VALUE(k_in.size(3) == D, "k's head_dim must be q's (", D, "), got k ", k_in.sizes());
  TORCH_CHECK_VALUE(v_in.size(2) == Sk, "v must have k's sequence length (", Sk, "), got v ", v_in.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale must be finite, got ", scale);
  checks::output_qparams(out_scale, out_zero_point, out_dtype);
  const bool has_mask = mask_in.has_value() && mask_in->defined();
  TORCH_CHECK_VALUE(!(has_mask && is_causal), "give either a mask or is_causal=True, not both");

  // [B,Sq,H,Dv] memory, seen as [B,H,Sq,Dv]
  at::Tensor out = at::empty({B, Sq, H, Dv}, q_in.options().dtype(out_dtype)).transpose(1, 2);
  at::Tensor mask = has_mask ? broadcast_mask(*mask_in, B, H, Sq, Sk) : at::Tensor();
  if (out.numel() == 0) return out;
  if (Sk == 0) {  // nothing to attend to: every row is fully masked
    out.fill_(checks::is_int8_type(out_dtype) ? double(out_zero_point) : 0.0);
    return out;
  }
  const at::Tensor q = last_dim_dense(q_in), k = last_dim_dense(k_in), v = last_dim_dense(v_in);
  if (!qbackend::cpu::has(qbackend::cpu::Isa::Avx512)) {
    attention_fallback(q, k, v, has_mask ? std::optional<at::Tensor>(mask) : std::nullopt, scale, is_causal,
                       out_scale, out_zero_point, out);
    return out;
  }

  AttentionProblem p;
  p.B = B, p.H = H, p.Sq = Sq, p.Sk = Sk, p.D = D, p.Dv = Dv;
  p.in = q.scalar_type() == at::kFloat ? AttnIn::f32 : AttnIn::bf16;
  p.q = q.const_data_ptr(), p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_si = q.stride(2);
  p.k = k.const_data_ptr(), p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_si = k.stride(2);
  p.v = v.const_data_ptr(), p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_si = v.stride(2);
  if (has_mask) {
    p.mask_kind = mask.scalar_type() == at::kBool ? AttnMask::boolean
                  : mask.scalar_type() == at::kFloat ? AttnMask::f32 : AttnMask::bf16;
    p.mask = mask.const_data_ptr();
    p.m_sb = mask.stride(0), p.m_sh = mask.stride(1), p.m_si = mask.stride(2);
  }
  p.causal = is_causal;
  p.scale = static_cast<float>(scale);
  p.out_kind = out_kind(out_dtype);
  p.out = out.mutable_data_ptr();
  p.o_sb = out.stride(0), p.o_sh = out.stride(1), p.o_si = out.stride(2);
  p.out_scale = static_cast<float>(out_scale);
  p.out_zp = static_cast<int32_t>(out_zero_point);
  p.bf16_products = bf16_products && qbackend::cpu::bf16_products_pay();
  const auto rows = p.bf16_products ? kernels::attention_rows_avx512_bf16 : kernels::attention_rows_avx512;

  // Tasks: (b, h, chunk of query rows). Heads are split only when there are too few of them to
  // keep every thread busy (each task widens and transposes its head's k once).
  const int64_t blocks = (Sq + kRowBlock - 1) / kRowBlock;
  const int64_t want = 2 * at::get_num_threads();
  const int64_t chunks = std::min(blocks, std::max<int64_t>(1, (want + B * H - 1) / (B * H)));
  const int64_t rows_per_chunk = (blocks + chunks - 1) / chunks * kRowBlock;
  const size_t scratch_floats = kernels::attention_scratch_floats(p);
  parallel::parallel_for(0, B * H * chunks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / chunks, c = t % chunks;
      const int64_t i0 = c * rows_per_chunk, i1 = std::min(Sq, i0 + rows_per_chunk);
      if (i0 < i1) rows(p, bh / H, bh % H, i0, i1, scratch.data());
    }
  });
  return out;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool is_causal=False, "
        "ScalarType out_dtype=float, float out_scale=1.0, int out_zero_point=0, bool bf16_products=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("attention", &qbackend::ops::attention); }
