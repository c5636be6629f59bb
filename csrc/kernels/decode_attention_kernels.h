// Attention for one decoding step (no torch headers): each sequence's query at one new position
// against its key/value cache, the query heads that share a key head (GQA) taken together so each
// cached key and value row is read once for all of them:
//
//   out[b, h, :] = sum_s p_s v[b, h / R, s, :],   p = softmax_s(scale * q[b, h, :] . k[b, h / R, s, :])
//
// with R = H / KV query heads per key head, every cached position attended (no mask: the caller
// sends masked steps to SDPA). fp32 throughout: each score a 16-lane (AVX2: 8-lane) fp32 dot product summed
// across lanes, exp(score - max) by a degree-7 polynomial, the weighted sum of v rows in position order,
// divided by the sum of the exponentials at the end. torch's SDPA rounds differently (its own exp
// and blocking): outputs agree to fp32 rounding, not bit for bit.
//
// Int8 keys and values (k8 and v8 set; an int8 KV cache, qbackend.llm.Int8KVCache): each cached row
// is int8 values times its own fp32 scale, k[b, g, s, :] = k8[b, g, s, :] * k_scale[b, g, s] (v
// likewise); the kernel widens the int8 values exactly and applies the row's scale to its dot product
// (keys) or to its softmax weight (values), never storing the rows in fp32.
#pragma once
#include <cstddef>
#include <cstdint>

namespace qbackend::kernels {

struct DecodeAttention {
  int64_t B = 0, H = 0, KV = 0, S = 0, D = 0;
  const float* q = nullptr;  // [B, H, D], contiguous
  const float* k = nullptr;  // [B, KV, S, D], element strides below, the last dimension contiguous
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  const float* v = nullptr;  // [B, KV, S, D], likewise
  int64_t v_sb = 0, v_sh = 0, v_ss = 0;
  float* out = nullptr;  // [B, H, D], contiguous
  float scale = 1.0f;
  // int8 rows (see above; k and v unused then): the int8 values with strides like k's and v's, the row
  // scales [B, KV, S'] with element strides per sequence and per head (positions contiguous)
  const int8_t* k8 = nullptr;
  const float* k_scale = nullptr;
  int64_t ks_sb = 0, ks_sh = 0;
  const int8_t* v8 = nullptr;
  const float* v_scale = nullptr;
  int64_t vs_sb = 0, vs_sh = 0;
};

// Floats of scratch one call of a decoding kernel needs (per thread): the R x S scores.
inline size_t decode_attention_scratch_floats(const DecodeAttention& p) {
  return static_cast<size_t>(p.H / (p.KV > 1 ? p.KV : 1)) * static_cast<size_t>(p.S);
}

// The R query heads of key head `kvh` of sequence `b`; S >= 1, scratch of decode_attention_scratch_floats.
// One kernel per ISA: call decode_attention_avx512 only when qbackend::cpu::has(Isa::Avx512) and
// decode_attention_avx2 only when qbackend::cpu::has(Isa::Avx2).
using DecodeAttentionFn = void (*)(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch);
void decode_attention_avx512(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch);
void decode_attention_avx2(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch);

}  // namespace qbackend::kernels
