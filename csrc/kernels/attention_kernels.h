// Fused attention kernel (no torch headers): out = softmax(scale * q k^T + mask) v for a block of
// query rows of one (batch, head), with the output converted in the same pass (fp32, bf16, or
// quantized to uint8/int8 like qbackend::quantize_per_tensor: clamp(rne(y / scale) + zp)).
//
// Semantics match torch.nn.functional.scaled_dot_product_attention (dropout 0): a boolean mask
// keeps the positions where it is true (false -> -inf), a float mask is added; is_causal keeps
// j <= i (top-left aligned); a row with every key masked gives 0 (as torch's CPU kernels do).
// Arithmetic is fp32 (bf16 inputs and masks are widened exactly; the scale is applied to q), except
// that with bf16_products the two matrix products take bf16 operands (q * scale, k, the softmax
// numerators P and v, each rounded to nearest even) and accumulate in fp32: twice the products
// per instruction (AVX512-BF16's vdpbf16ps), the precision of torch's BF16 SDPA.
//
// Layouts: every operand's last dimension is contiguous; the others are element strides (the
// views torch hands SDPA after a Linear's reshape and transpose need no copy). bf16 values are
// passed as their uint16_t bit patterns.
#pragma once
#include <cstddef>
#include <cstdint>

namespace qbackend::kernels {

enum class AttnIn : int { f32, bf16 };
enum class AttnMask : int { none, boolean, f32, bf16 };
enum class AttnOut : int { f32, bf16, u8, s8 };

struct AttentionProblem {
  int64_t B = 0, H = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  AttnIn in = AttnIn::f32;
  const void* q = nullptr;  // [B, H, Sq, D]
  int64_t q_sb = 0, q_sh = 0, q_si = 0;
  const void* k = nullptr;  // [B, H, Sk, D]
  int64_t k_sb = 0, k_sh = 0, k_si = 0;
  const void* v = nullptr;  // [B, H, Sk, Dv]
  int64_t v_sb = 0, v_sh = 0, v_si = 0;
  AttnMask mask_kind = AttnMask::none;
  const void* mask = nullptr;  // [B, H, Sq, Sk] (broadcast dimensions have stride 0)
  int64_t m_sb = 0, m_sh = 0, m_si = 0;
  bool causal = false;
  float scale = 1.0f;
  AttnOut out_kind = AttnOut::f32;
  void* out = nullptr;  // [B, H, Sq, Dv]
  int64_t o_sb = 0, o_sh = 0, o_si = 0;
  float out_scale = 1.0f;  // u8/s8 output only (finite, > 0)
  int32_t out_zp = 0;      // in the output type's range
  // q k^T and P v with q, k, P, v rounded to bf16 (fp32 accumulation; attention_rows_avx512_bf16)
  bool bf16_products = false;
};

// Floats of scratch one call of attention_rows_avx512(_bf16) needs for problem p (per thread).
size_t attention_scratch_floats(const AttentionProblem& p);

// Rows [i0, i1) of head (b, h). scratch: attention_scratch_floats(p) floats (no alignment needed).
// Only call it when qbackend::cpu::has(qbackend::cpu::Isa::Avx512) (AVX512 F/BW/VL/DQ).
void attention_rows_avx512(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1, float* scratch);
// The same with bf16 products (p.bf16_products); only when qbackend::cpu::bf16_usable().
void attention_rows_avx512_bf16(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                float* scratch);

// Throughput loops for qbackend::cpu::bf16_products_pay() (cpu/bf16_speed.cpp): `iters` iterations
// of QB_ZMM_THROUGHPUT_LOOP (avx512_common.h) over fp32 FMAs (resp. bf16 dot products, vdpbf16ps);
// they return the fp32 operations done (2 per multiply-add). The bf16 one only when
// qbackend::cpu::bf16_usable().
double fma_flops_avx512(int64_t iters);
double bf16_dot_flops_avx512(int64_t iters);

}  // namespace qbackend::kernels
