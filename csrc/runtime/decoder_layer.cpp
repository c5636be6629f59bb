// qbackend._C.DecoderLayer: a Llama-style decoder layer (pre-norm RMSNorm, attention with rotary
// embeddings, a SiLU-gated MLP: Llama, Mistral, Qwen2) whose Linears are qbackend's weight-only ops,
// computed in one native call per layer and step (two where the KV cache is not one it appends to in
// place) instead of the ~40 torch ops and ten module calls of the model's Python.
// qbackend/llm/decoder_layers.py holds the module that calls it, decides when it applies, and updates
// the model's KV cache between the two calls where step does not apply.
//
//   attention_inputs(hidden, cos, sin) -> (q, k, v)
//       x = rms_norm(hidden, norm1, eps1); [q | k | v] = qkv(x), one fused product; q and k rotated as
//       transformers' apply_rotary_pos_emb does, in the same float32 operations:
//         out[d]     = t[d] * cos[d] + (-t[d + D/2]) * sin[d]
//         out[d+D/2] = t[d + D/2] * cos[d + D/2] + t[d] * sin[d + D/2]        (d < D/2)
//       hidden float32 [B, L, hidden_size]; cos, sin float32 [B or 1, L, D]; returns q
//       [B, heads, L, D], k and v [B, kv_heads, L, D], contiguous.
//   step(hidden, cos, sin, key_rows, value_rows, pos, mask) -> (hidden', keys, values)
//       the two calls and the KV cache's append between them in one: k and v written into positions
//       pos .. pos + L of key_rows / value_rows (contiguous [B, kv_heads, capacity, D], a cache's storage),
//       keys and values their first pos + L positions (views), hidden' finish's over them. An error
//       leaves the storages' first pos positions as they were.
//   finish(hidden, q, k, v, mask) -> hidden'
//       k, v [B, kv_heads, S, D]: every position so far (the caller's cache update); mask None or
//       the model's attention mask (bool, or float added to the scores) for SDPA;
//       a = the attention of q over k, v; h = hidden + o(a);
//       hidden' = h + down(silu(gate) * up), [gate | up] = gate_up(rms_norm(h, norm2, eps2)).
//
// The attention: one query position without a mask (a decoding step) on an AVX2 or AVX512 CPU, the decoding
// kernel (kernels/decode_attention_kernels.h: equal to SDPA within fp32 rounding); otherwise SDPA as
// transformers' sdpa_attention_forward calls it (GQA in SDPA without a mask, queries packed by key
// head for one position with a mask, keys repeated otherwise; causal when there is no mask and more
// than one query), bit for bit the model's own. The products are the ops qbackend's modules call
// (ops/woq_ops.h), the norms qbackend::rms_norm, SiLU and the MLP's product ATen's, so everything but
// the decoding kernel gives the module path's bits. Both calls release the GIL; the layer holds no
// per-call state.
#include "runtime/decoder_layer.h"

#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/probe.h"
#include "kernels/decode_attention_kernels.h"
#include "ops/rms_norm_ops.h"
#include "ops/woq_ops.h"
#include "runtime/parallel.h"

namespace py = pybind11;

namespace qbackend {
namespace {

using at::Tensor;

// A weight-only Linear's arguments from Python: (kind, weight tiles, scales or scale tiles, offset
// tiles or None, bias or None, group_size (0 for int8), in_features, out_features).
using ProductArgs = std::tuple<std::string, Tensor, Tensor, std::optional<Tensor>, std::optional<Tensor>, int64_t,
                               int64_t, int64_t>;

// One weight-only Linear: the op its module calls and that op's arguments.
class WeightOnlyProduct {
 public:
  enum class Kind { kInt8, kInt8A8, kInt4, kInt4A8 };

  WeightOnlyProduct(const ProductArgs& a, const char* name)
      : w_(std::get<1>(a)), scales_(std::get<2>(a)), bias_(std::get<4>(a)), group_size_(std::get<5>(a)),
        in_(std::get<6>(a)), out_(std::get<7>(a)) {
    const std::string& kind = std::get<0>(a);
    if (kind == "int8") {
      kind_ = Kind::kInt8;
    } else if (kind == "int8a8") {
      kind_ = Kind::kInt8A8;
    } else if (kind == "int4") {
      kind_ = Kind::kInt4;
    } else if (kind == "int4a8") {
      kind_ = Kind::kInt4A8;
    } else {
      TORCH_CHECK_VALUE(false, name, ": kind must be int8, int8a8, int4 or int4a8, got ", kind);
    }
    const bool int4 = kind_ == Kind::kInt4 || kind_ == Kind::kInt4A8;
    TORCH_CHECK_VALUE(!int4 || std::get<3>(a).has_value(), name, ": 4-bit weights need their offsets");
    if (int4) offsets_ = *std::get<3>(a);
    TORCH_CHECK_VALUE(in_ > 0 && out_ > 0, name, ": in_features and out_features must be > 0, got ", in_, " and ",
                      out_);
    TORCH_CHECK_VALUE(int4 || scales_.numel() == out_, name, ": ", scales_.numel(), " scales for ", out_,
                      " output features");
  }

  Tensor operator()(const Tensor& x) const {
    switch (kind_) {
      case Kind::kInt8:
        return ops::woq_linear(x, w_, scales_, bias_);
      case Kind::kInt8A8:
        return ops::woq_a8_linear(x, w_, scales_, bias_);
      case Kind::kInt4:
        return ops::woq4_linear(x, w_, scales_, offsets_, group_size_, in_, out_, bias_);
      case Kind::kInt4A8:
        return ops::woq4a8_linear(x, w_, scales_, offsets_, group_size_, in_, out_, bias_);
    }
    return {};
  }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  Kind kind_ = Kind::kInt8;
  Tensor w_, scales_, offsets_;
  std::optional<Tensor> bias_;
  int64_t group_size_, in_, out_;
};

// One head's rotary embedding (the contract above); D even.
inline void rotate(const float* t, const float* c, const float* s, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float lo = t[d], hi = t[d + half];
    out[d] = lo * c[d] + (-hi) * s[d];
    out[d + half] = hi * c[d + half] + lo * s[d + half];
  }
}

void check_float3(const Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3, name,
                    " must be a float32 CPU tensor [batch, length, features], got ",
                    t.defined() ? t.toString() : std::string("None"), " ", t.defined() ? t.sizes() : at::IntArrayRef{});
}

// Work (multiply-adds) below which the decoding attention runs on the calling thread: a parallel
// region costs more than the arithmetic of a small model's step (SmolLM2: 9 heads x 64 x ~100 positions).
constexpr int64_t kSerialAttentionWork = int64_t(1) << 18;

// The decoding attention kernel for this CPU (within the QBACKEND_ISA cap) and its ISA's name: AVX512,
// else AVX2 with FMA; {null, ""} where it has neither (those steps go to SDPA).
struct DecodingKernel {
  kernels::DecodeAttentionFn fn;
  const char* isa;
};

DecodingKernel decoding_kernel() {
  if (cpu::has(cpu::Isa::Avx512)) return {&kernels::decode_attention_avx512, "avx512"};
  if (cpu::has(cpu::Isa::Avx2)) return {&kernels::decode_attention_avx2, "avx2"};
  return {nullptr, ""};
}

// One step's attention for the decoding kernel (q [B, H, 1, D], k and v [B, KV, S, D] with their
// last dimension contiguous, no mask): [B, 1, H * D]. With k_scale and v_scale defined, k and v are
// int8 rows [B, KV, >= S, D] and those their row scales [B, KV, >= S] (positions contiguous).
Tensor decode_attention(kernels::DecodeAttentionFn kernel, const Tensor& q_in, const Tensor& k, const Tensor& v,
                        int64_t S, double scaling, const Tensor& k_scale = {}, const Tensor& v_scale = {}) {
  const Tensor q = q_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), KV = k.size(1);
  Tensor out = at::empty({B, 1, H * D}, q.options());
  kernels::DecodeAttention p;
  p.B = B, p.H = H, p.KV = KV, p.S = S, p.D = D;
  p.q = q.const_data_ptr<float>();
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_ss = k.stride(2);
  p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_ss = v.stride(2);
  if (k_scale.defined()) {
    p.k8 = k.const_data_ptr<int8_t>(), p.v8 = v.const_data_ptr<int8_t>();
    p.k_scale = k_scale.const_data_ptr<float>(), p.ks_sb = k_scale.stride(0), p.ks_sh = k_scale.stride(1);
    p.v_scale = v_scale.const_data_ptr<float>(), p.vs_sb = v_scale.stride(0), p.vs_sh = v_scale.stride(1);
  } else {
    p.k = k.const_data_ptr<float>(), p.v = v.const_data_ptr<float>();
  }
  p.out = out.mutable_data_ptr<float>();
  p.scale = static_cast<float>(scaling);
  const size_t scratch_floats = kernels::decode_attention_scratch_floats(p);
  const auto heads = [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    for (int64_t t = t0; t < t1; ++t) kernel(p, t / KV, t % KV, scratch.data());
  };
  if (B * H * S * D <= kSerialAttentionWork) heads(0, B * KV);
  else parallel::parallel_for(0, B * KV, 1, heads);
  return out;
}

// Int8 rows [B, KV, >= S, D] times their scales [B, KV, >= S]: the first S positions in float32.
Tensor dequantized_rows(const Tensor& rows, const Tensor& scales, int64_t S) {
  return rows.narrow(2, 0, S).to(at::kFloat).mul(scales.narrow(2, 0, S).unsqueeze(-1));
}

class DecoderLayer {
 public:
  DecoderLayer(Tensor norm1, double eps1, const ProductArgs& qkv, const ProductArgs& o, Tensor norm2, double eps2,
               const ProductArgs& gate_up, const ProductArgs& down, int64_t heads, int64_t kv_heads,
               int64_t head_dim, double scaling)
      : norm1_(std::move(norm1)), norm2_(std::move(norm2)), eps1_(eps1), eps2_(eps2), qkv_(qkv, "qkv"), o_(o, "o"),
        gate_up_(gate_up, "gate_up"), down_(down, "down"), heads_(heads), kv_heads_(kv_heads), D_(head_dim),
        scaling_(scaling) {
    TORCH_CHECK_VALUE(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads (", heads,
                      ") must be a positive multiple of kv_heads (", kv_heads, ")");
    TORCH_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0, "head_dim must be even and > 0, got ", head_dim);
    hidden_ = norm1_.numel();
    TORCH_CHECK_VALUE(norm1_.dim() == 1 && norm2_.dim() == 1 && norm2_.numel() == hidden_, "norm1 and norm2 must be "
                      "1-D weights of the hidden size, got ", norm1_.sizes(), " and ", norm2_.sizes());
    TORCH_CHECK_VALUE(qkv_.in_features() == hidden_ && qkv_.out_features() == (heads + 2 * kv_heads) * head_dim,
                      "qkv must map ", hidden_, " features to (heads + 2 kv_heads) * head_dim = ",
                      (heads + 2 * kv_heads) * head_dim, ", got ", qkv_.in_features(), " -> ", qkv_.out_features());
    TORCH_CHECK_VALUE(o_.in_features() == heads * head_dim && o_.out_features() == hidden_, "o must map ",
                      heads * head_dim, " features to ", hidden_, ", got ", o_.in_features(), " -> ",
                      o_.out_features());
    TORCH_CHECK_VALUE(gate_up_.in_features() == hidden_ && gate_up_.out_features() % 2 == 0 &&
                          down_.in_features() * 2 == gate_up_.out_features() && down_.out_features() == hidden_,
                      "gate_up must map ", hidden_, " features to 2 I and down I to ", hidden_, ", got ",
                      gate_up_.in_features(), " -> ", gate_up_.out_features(), " and ", down_.in_features(), " -> ",
                      down_.out_features());
  }

  std::tuple<Tensor, Tensor, Tensor> attention_inputs(const Tensor& hidden, const Tensor& cos,
                                                      const Tensor& sin) const {
    check_inputs(hidden, cos, sin);
    const int64_t B = hidden.size(0), L = hidden.size(1);
    const auto opts = hidden.options();
    Tensor q = at::empty({B, heads_, L, D_}, opts), k = at::empty({B, kv_heads_, L, D_}, opts),
           v = at::empty({B, kv_heads_, L, D_}, opts);
    project(hidden, cos, sin, q, k.data_ptr<float>(), v.data_ptr<float>(), L, 0);
    return {q, k, v};
  }

  // attention_inputs, the rows' append and finish in one call: k and v written into positions pos ..
  // pos + L of key_rows and value_rows (contiguous float32 [B, kv_heads, capacity, D]: a KV cache's
  // storage), then the attention over their first pos + L positions. Returns (hidden', the storages'
  // first pos + L positions as views). Every argument is checked before anything is written.
  std::tuple<Tensor, Tensor, Tensor> step(const Tensor& hidden, const Tensor& cos, const Tensor& sin,
                                          const Tensor& key_rows, const Tensor& value_rows, int64_t pos,
                                          const std::optional<Tensor>& mask) const {
    check_inputs(hidden, cos, sin);
    const int64_t B = hidden.size(0), L = hidden.size(1);
    for (const auto& [t, name] :
         {std::pair<const Tensor&, const char*>{key_rows, "key_rows"}, {value_rows, "value_rows"}})
      TORCH_CHECK_VALUE(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 4 &&
                            t.is_contiguous() && t.size(0) == B && t.size(1) == kv_heads_ && t.size(3) == D_ &&
                            t.sizes() == key_rows.sizes(),
                        name, " must be contiguous float32 [", B, ", ", kv_heads_, ", capacity, ", D_,
                        "] of one shape, got ", t.defined() ? t.toString() : std::string("None"), " ",
                        t.defined() ? t.sizes() : at::IntArrayRef{});
    TORCH_CHECK_VALUE(key_rows.data_ptr() != value_rows.data_ptr(), "key_rows and value_rows must be two storages");
    TORCH_CHECK_VALUE(pos >= 0 && pos + L <= key_rows.size(2), "positions ", pos, " .. ", pos + L,
                      " do not fit a capacity of ", key_rows.size(2));
    Tensor q = at::empty({B, heads_, L, D_}, hidden.options());
    project(hidden, cos, sin, q, key_rows.data_ptr<float>(), value_rows.data_ptr<float>(), key_rows.size(2), pos);
    Tensor keys = key_rows.narrow(2, 0, pos + L), values = value_rows.narrow(2, 0, pos + L);
    return {finish(hidden, q, keys, values, mask), keys, values};
  }

  Tensor finish(const Tensor& hidden, const Tensor& q, const Tensor& k, const Tensor& v,
                const std::optional<Tensor>& mask) const {
    check_float3(hidden, "hidden");
    const int64_t B = hidden.size(0), L = hidden.size(1), H = heads_, KV = kv_heads_, D = D_;
    TORCH_CHECK_VALUE(hidden.size(2) == hidden_, "hidden must have ", hidden_, " features, got ", hidden.size(2));
    TORCH_CHECK_VALUE(q.dim() == 4 && q.size(0) == B && q.size(1) == H && q.size(2) == L && q.size(3) == D,
                      "q must be [", B, ", ", H, ", ", L, ", ", D, "], got ", q.sizes());
    TORCH_CHECK_VALUE(k.dim() == 4 && v.dim() == 4 && k.size(0) == B && k.size(1) == KV && k.size(3) == D &&
                          v.sizes() == k.sizes(),
                      "k and v must be [", B, ", ", KV, ", positions, ", D, "], got ", k.sizes(), " and ", v.sizes());
    const bool decoding = L == 1 && !mask && k.size(2) > 0 && k.stride(3) == 1 && v.stride(3) == 1;
    const kernels::DecodeAttentionFn kernel = decoding ? decoding_kernel().fn : nullptr;
    const Tensor a = kernel ? decode_attention(kernel, q, k, v, k.size(2), scaling_) : sdpa(q, k, v, mask);
    return after_attention(hidden, a);
  }

  // finish() for one position against an int8 KV cache of `length` positions (qbackend.llm.kv_cache):
  // k8, v8 int8 [B, kv_heads, >= length, D] and their row scales float32 [B, kv_heads, >= length], each
  // contiguous; no mask. The decoding kernel reads the int8 rows where the CPU has one (decoding_kernel);
  // elsewhere they are dequantized for SDPA.
  Tensor finish_int8(const Tensor& hidden, const Tensor& q, const Tensor& k8, const Tensor& k_scale, const Tensor& v8,
                     const Tensor& v_scale, int64_t length) const {
    check_float3(hidden, "hidden");
    const int64_t B = hidden.size(0), H = heads_, KV = kv_heads_, D = D_;
    TORCH_CHECK_VALUE(hidden.size(1) == 1 && hidden.size(2) == hidden_, "hidden must be [", B, ", 1, ", hidden_,
                      "] (one position), got ", hidden.sizes());
    TORCH_CHECK_VALUE(q.dim() == 4 && q.size(0) == B && q.size(1) == H && q.size(2) == 1 && q.size(3) == D,
                      "q must be [", B, ", ", H, ", 1, ", D, "], got ", q.sizes());
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{k8, "k8"}, {v8, "v8"}})
      TORCH_CHECK_VALUE(t.scalar_type() == at::kChar && t.dim() == 4 && t.size(0) == B && t.size(1) == KV &&
                            t.size(3) == D && t.is_contiguous(),
                        name, " must be contiguous int8 [", B, ", ", KV, ", capacity, ", D, "], got ", t.toString(),
                        " ", t.sizes());
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{k_scale, "k_scale"}, {v_scale, "v_scale"}})
      TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat && t.dim() == 3 && t.size(0) == B && t.size(1) == KV &&
                            t.size(2) == k8.size(2) && t.is_contiguous(),
                        name, " must be contiguous float32 [", B, ", ", KV, ", ", k8.size(2), "], got ", t.toString(),
                        " ", t.sizes());
    TORCH_CHECK_VALUE(v8.sizes() == k8.sizes(), "v8 must have k8's shape ", k8.sizes(), ", got ", v8.sizes());
    TORCH_CHECK_VALUE(length >= 1 && length <= k8.size(2), "length must be in [1, ", k8.size(2), "], got ", length);
    const kernels::DecodeAttentionFn kernel = decoding_kernel().fn;
    const Tensor a = kernel ? decode_attention(kernel, q, k8, v8, length, scaling_, k_scale, v_scale)
                            : sdpa(q, dequantized_rows(k8, k_scale, length), dequantized_rows(v8, v_scale, length),
                                   std::nullopt);
    return after_attention(hidden, a);
  }

 private:
  void check_inputs(const Tensor& hidden, const Tensor& cos, const Tensor& sin) const {
    check_float3(hidden, "hidden");
    TORCH_CHECK_VALUE(hidden.size(2) == hidden_, "hidden must have ", hidden_, " features, got ", hidden.size(2));
    const int64_t B = hidden.size(0), L = hidden.size(1);
    for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{cos, "cos"}, {sin, "sin"}}) {
      check_float3(t, name);
      TORCH_CHECK_VALUE((t.size(0) == B || t.size(0) == 1) && t.size(1) == L && t.size(2) == D_, name,
                        " must be [", B, " or 1, ", L, ", ", D_, "], got ", t.sizes());
    }
    TORCH_CHECK_VALUE(cos.size(0) == sin.size(0), "cos and sin must have one batch size, got ", cos.size(0),
                      " and ", sin.size(0));
  }

  // [q | k | v] = qkv(rms_norm(hidden)), q and k rotated: q into `q` [B, heads, L, D]; k and v into
  // kp and vp, [B, kv_heads, cap, D] at positions pos .. pos + L (arguments checked by the caller).
  void project(const Tensor& hidden, const Tensor& cos, const Tensor& sin, Tensor& q, float* kp, float* vp,
               int64_t cap, int64_t pos) const {
    const int64_t B = hidden.size(0), L = hidden.size(1), H = heads_, KV = kv_heads_, D = D_;
    if (B * L == 0) return;
    const Tensor qkv = qkv_(ops::rms_norm(hidden, norm1_, eps1_)).contiguous();
    const Tensor c = cos.contiguous(), s = sin.contiguous();
    const float* src = qkv.data_ptr<float>();
    const float *cp = c.data_ptr<float>(), *sp = s.data_ptr<float>();
    float* qp = q.data_ptr<float>();
    const int64_t width = (H + 2 * KV) * D, rope_batch = c.size(0);
    at::parallel_for(0, B * L, std::max<int64_t>(1, 32768 / width), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / L, l = r % L;
        const float* row = src + r * width;
        const int64_t rope = ((rope_batch == 1 ? 0 : b) * L + l) * D;
        for (int64_t h = 0; h < H; ++h) rotate(row + h * D, cp + rope, sp + rope, qp + ((b * H + h) * L + l) * D, D);
        for (int64_t h = 0; h < KV; ++h) {
          const int64_t at_kv = ((b * KV + h) * cap + pos + l) * D;
          rotate(row + (H + h) * D, cp + rope, sp + rope, kp + at_kv, D);
          std::copy(row + (H + KV + h) * D, row + (H + KV + h + 1) * D, vp + at_kv);
        }
      }
    });
  }

  // h + down(silu(gate) * up) with h = hidden + o(a) (the contract above).
  Tensor after_attention(const Tensor& hidden, const Tensor& a) const {
    Tensor h = o_(a);
    h.add_(hidden);
    const Tensor gu = gate_up_(ops::rms_norm(h, norm2_, eps2_));
    const int64_t I = gu.size(-1) / 2;
    Tensor act = at::silu(gu.narrow(-1, 0, I));
    act.mul_(gu.narrow(-1, I, I));
    Tensor out = down_(act);
    out.add_(h);
    return out;
  }

  // SDPA as transformers' sdpa_attention_forward calls it (see the file comment): [B, L, H * D].
  Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask) const {
    const int64_t B = q.size(0), L = q.size(2), H = heads_, KV = kv_heads_, D = D_, n_rep = H / KV;
    Tensor query = q, key = k, value = v;
    std::optional<Tensor> m = mask;
    bool gqa = false;
    if (n_rep > 1) {
      if (!m && D <= 256) {
        gqa = true;
      } else if (L == 1) {
        query = q.reshape({B, KV, n_rep, D});
        if (m && m->dim() == 4 && m->size(1) != 1) m = m->reshape({m->size(0), m->size(1) / n_rep, n_rep, m->size(3)});
      } else {
        const int64_t S = k.size(2);
        key = k.unsqueeze(2).expand({B, KV, n_rep, S, D}).reshape({B, H, S, D});
        value = v.unsqueeze(2).expand({B, KV, n_rep, S, D}).reshape({B, H, S, D});
      }
    }
    const bool causal = L > 1 && !m;
    if (causal && key.size(2) > L) {
      key = key.narrow(2, 0, L);
      value = value.narrow(2, 0, L);
    }
    Tensor a = at::scaled_dot_product_attention(query, key, value, m, 0.0, causal, scaling_, gqa);
    return a.reshape({a.size(0), -1, L, D}).transpose(1, 2).contiguous().view({B, L, H * D});
  }

  Tensor norm1_, norm2_;
  double eps1_, eps2_;
  WeightOnlyProduct qkv_, o_, gate_up_, down_;
  int64_t heads_, kv_heads_, D_, hidden_ = 0;
  double scaling_;
};

// x float32 [B, KV, n, D] quantized row by row (symmetric int8: scale = max |row| / 127, values
// round(x / scale) half to even; a zero row gets scale 0, a row with a NaN or infinity a NaN scale)
// into rows[:, :, pos:pos + n] and scales[:, :, pos:pos + n] (int8 [B, KV, capacity, D] and float32
// [B, KV, capacity], contiguous).
void append_int8_rows(Tensor& rows, Tensor& scales, int64_t pos, const Tensor& x_in) {
  TORCH_CHECK_VALUE(x_in.scalar_type() == at::kFloat && x_in.dim() == 4, "x must be float32 [batch, heads, "
                    "positions, head_dim], got ", x_in.toString(), " ", x_in.sizes());
  const int64_t B = x_in.size(0), KV = x_in.size(1), n = x_in.size(2), D = x_in.size(3);
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kChar && rows.dim() == 4 && rows.is_contiguous() && rows.size(0) == B &&
                        rows.size(1) == KV && rows.size(3) == D,
                    "rows must be contiguous int8 [", B, ", ", KV, ", capacity, ", D, "], got ", rows.toString(), " ",
                    rows.sizes());
  const int64_t cap = rows.size(2);
  TORCH_CHECK_VALUE(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 3 &&
                        scales.size(0) == B && scales.size(1) == KV && scales.size(2) == cap,
                    "scales must be contiguous float32 [", B, ", ", KV, ", ", cap, "], got ", scales.toString(), " ",
                    scales.sizes());
  TORCH_CHECK_VALUE(pos >= 0 && pos + n <= cap, "positions ", pos, " .. ", pos + n, " do not fit a capacity of ", cap);
  const Tensor x = x_in.contiguous();
  const float* xp = x.const_data_ptr<float>();
  int8_t* rp = rows.mutable_data_ptr<int8_t>();
  float* sp = scales.mutable_data_ptr<float>();
  for (int64_t bh = 0; bh < B * KV; ++bh) {
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = xp + (bh * n + t) * D;
      int8_t* out = rp + (bh * cap + pos + t) * D;
      float amax = 0.0f;
      bool finite = true;
      for (int64_t d = 0; d < D; ++d) {
        finite = finite && std::isfinite(xr[d]);
        amax = std::max(amax, std::fabs(xr[d]));
      }
      const float scale = finite ? amax / 127.0f : NAN;
      sp[bh * cap + pos + t] = scale;
      for (int64_t d = 0; d < D; ++d)
        out[d] = scale > 0.0f ? int8_t(std::clamp(std::nearbyint(xr[d] / scale), -127.0f, 127.0f)) : int8_t(0);
    }
  }
}

// keys and values [B, KV, n, D] (same dtype as the storages) copied into positions pos .. pos + n of
// key_rows and value_rows (contiguous [B, KV, capacity, D]); returns the storages' first pos + n
// positions as views.
std::tuple<Tensor, Tensor> append_rows(Tensor& key_rows, Tensor& value_rows, int64_t pos, const Tensor& keys,
                                       const Tensor& values) {
  for (const Tensor* t : {&keys, &values})
    TORCH_CHECK_VALUE(t->dim() == 4 && t->sizes() == keys.sizes() && t->scalar_type() == keys.scalar_type(),
                      "keys and values must be [batch, heads, positions, head_dim] of one shape and dtype, got ",
                      keys.toString(), " ", keys.sizes(), " and ", values.toString(), " ", values.sizes());
  const int64_t n = keys.size(2);
  for (const Tensor* t : {&key_rows, &value_rows})
    TORCH_CHECK_VALUE(t->dim() == 4 && t->is_contiguous() && t->scalar_type() == keys.scalar_type() &&
                          t->size(0) == keys.size(0) && t->size(1) == keys.size(1) && t->size(3) == keys.size(3) &&
                          t->sizes() == key_rows.sizes(),
                      "key_rows and value_rows must be contiguous ", keys.toString(), " [", keys.size(0), ", ",
                      keys.size(1), ", capacity, ", keys.size(3), "] of one shape, got ", key_rows.sizes(), " and ",
                      value_rows.sizes());
  TORCH_CHECK_VALUE(pos >= 0 && pos + n <= key_rows.size(2), "positions ", pos, " .. ", pos + n,
                    " do not fit a capacity of ", key_rows.size(2));
  key_rows.narrow(2, pos, n).copy_(keys);
  value_rows.narrow(2, pos, n).copy_(values);
  return {key_rows.narrow(2, 0, pos + n), value_rows.narrow(2, 0, pos + n)};
}

}  // namespace

void register_decoder_layer(py::module_& m) {
  m.def("decode_attention_isa", [] { return std::string(decoding_kernel().isa); },
        "the instruction set of the decoding steps' attention kernel here (avx512, avx2), or '' (SDPA)");
  m.def("append_int8_rows", &append_int8_rows, py::arg("rows"), py::arg("scales"), py::arg("pos"), py::arg("x"),
        "x's rows quantized to int8 (one scale per row) into rows and scales at positions pos.. "
        "(csrc/runtime/decoder_layer.cpp)", py::call_guard<py::gil_scoped_release>());
  m.def("append_rows", &append_rows, py::arg("key_rows"), py::arg("value_rows"), py::arg("pos"), py::arg("keys"),
        py::arg("values"), "keys and values copied into the row storages at positions pos..; returns the storages' "
        "first pos + n positions (csrc/runtime/decoder_layer.cpp)", py::call_guard<py::gil_scoped_release>());
  py::class_<DecoderLayer>(m, "DecoderLayer",
                           "A Llama-style decoder layer in two native calls (csrc/runtime/decoder_layer.cpp); "
                           "built and called by qbackend.llm.decoder_layers.NativeDecoderLayer.")
      .def(py::init<Tensor, double, const ProductArgs&, const ProductArgs&, Tensor, double, const ProductArgs&,
                    const ProductArgs&, int64_t, int64_t, int64_t, double>(),
           py::arg("norm1"), py::arg("eps1"), py::arg("qkv"), py::arg("o"), py::arg("norm2"), py::arg("eps2"),
           py::arg("gate_up"), py::arg("down"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("scaling"))
      .def("attention_inputs", &DecoderLayer::attention_inputs, py::arg("hidden"), py::arg("cos"), py::arg("sin"),
           py::call_guard<py::gil_scoped_release>())
      .def("step", &DecoderLayer::step, py::arg("hidden"), py::arg("cos"), py::arg("sin"), py::arg("key_rows"),
           py::arg("value_rows"), py::arg("pos"), py::arg("mask"), py::call_guard<py::gil_scoped_release>())
      .def("finish", &DecoderLayer::finish, py::arg("hidden"), py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("mask"), py::call_guard<py::gil_scoped_release>())
      .def("finish_int8", &DecoderLayer::finish_int8, py::arg("hidden"), py::arg("q"), py::arg("k8"),
           py::arg("k_scale"), py::arg("v8"), py::arg("v_scale"), py::arg("length"),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace qbackend
