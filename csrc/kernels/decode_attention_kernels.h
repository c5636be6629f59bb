// Attention for one decoding step (no torch headers): each sequence's query at one new position
// against its key/value cache, the query heads that share a key head (GQA) taken together so each
// cached key and value row is read once for all of them:
//
//   out[b, h, :] = sum_s p_s v[b, h / R, s, :],   p = softmax_s(scale * q[b, h, :] . k[b, h / R, s, :])
//
// with R = H / KV query heads per key head, every cached position attended (no mask: the caller
// sends masked steps to SDPA). fp32 throughout: each score a 16-lane fp32 dot product summed across
// lanes, exp(score - max) by avx512::exp_nonpositive, the weighted sum of v rows in position order,
// divided by the sum of the exponentials at the end. torch's SDPA rounds differently (its own exp
// and blocking): outputs agree to fp32 rounding, not bit for bit.
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
};

// Floats of scratch one call of decode_attention_avx512 needs (per thread): the R x S scores.
size_t decode_attention_scratch_floats(const DecodeAttention& p);

// The R query heads of key head `kvh` of sequence `b`; S >= 1. Only call it when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512).
void decode_attention_avx512(const DecodeAttention& p, int64_t b, int64_t kvh, float* scratch);

}  // namespace qbackend::kernels
