// AVX512 (F/BW/VL/DQ) building blocks shared by the kernel translation units (quantize, GEMM
// epilogue, attention, LayerNorm). Include it AFTER the translation unit's `QB_TARGET` (cpu/targets.h):
// everything here is in an anonymous namespace, so each translation unit compiles its own copy
// for its own target and no inline function is shared between units built for different ISAs.
#pragma once

// GCC 12 warns falsely about the `__Y = __Y` inside _mm512_undefined_* of the intrinsics headers
// (GCC bug 105593, fixed in 13): silenced for every translation unit that uses these blocks.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

// A throughput loop: `iters` times, the registers zmm0..11, 30, 31 zeroed (an fp32 unit must not
// meet denormals or NaNs, which some CPUs run through slow microcode), then 8 x 12 independent
// instructions `ins zmm30, zmm31, zmm0..11`, in one inline-assembly statement so the compiler can
// neither drop nor reorder them. QB_ZMM_THROUGHPUT_INSNS instructions per iteration.
#define QB_ZMM_THROUGHPUT_INSNS 96
#define QB_ZMM_THROUGHPUT_LOOP(iters, ins)                                                          \
  for (int64_t i_ = 0; i_ < (iters); ++i_) {                                                        \
    __asm__ volatile(                                                                               \
        "vpxord %%zmm0, %%zmm0, %%zmm0\n\t vpxord %%zmm1, %%zmm1, %%zmm1\n\t"                          \
        "vpxord %%zmm2, %%zmm2, %%zmm2\n\t vpxord %%zmm3, %%zmm3, %%zmm3\n\t"                          \
        "vpxord %%zmm4, %%zmm4, %%zmm4\n\t vpxord %%zmm5, %%zmm5, %%zmm5\n\t"                          \
        "vpxord %%zmm6, %%zmm6, %%zmm6\n\t vpxord %%zmm7, %%zmm7, %%zmm7\n\t"                          \
        "vpxord %%zmm8, %%zmm8, %%zmm8\n\t vpxord %%zmm9, %%zmm9, %%zmm9\n\t"                          \
        "vpxord %%zmm10, %%zmm10, %%zmm10\n\t vpxord %%zmm11, %%zmm11, %%zmm11\n\t"                    \
        "vpxord %%zmm30, %%zmm30, %%zmm30\n\t vpxord %%zmm31, %%zmm31, %%zmm31\n\t"                    \
        ".rept 8\n\t"                                                                                 \
        ins " %%zmm30, %%zmm31, %%zmm0\n\t" ins " %%zmm30, %%zmm31, %%zmm1\n\t"                         \
        ins " %%zmm30, %%zmm31, %%zmm2\n\t" ins " %%zmm30, %%zmm31, %%zmm3\n\t"                         \
        ins " %%zmm30, %%zmm31, %%zmm4\n\t" ins " %%zmm30, %%zmm31, %%zmm5\n\t"                         \
        ins " %%zmm30, %%zmm31, %%zmm6\n\t" ins " %%zmm30, %%zmm31, %%zmm7\n\t"                         \
        ins " %%zmm30, %%zmm31, %%zmm8\n\t" ins " %%zmm30, %%zmm31, %%zmm9\n\t"                         \
        ins " %%zmm30, %%zmm31, %%zmm10\n\t" ins " %%zmm30, %%zmm31, %%zmm11\n\t"                       \
        ".endr\n\t" ::                                                                                \
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",   \
              "xmm11", "xmm30", "xmm31");                                                            \
  }

namespace qbackend::kernels {
namespace {
namespace avx512 {

constexpr int64_t W = 16;  // fp32 lanes

// The first min(n, 16) lanes.
inline __mmask16 tail_mask(int64_t n) { return n >= W ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

// Full vectors take plain stores: masked stores to memory are several times slower on AMD Zen 4/5
// (benchmarks/results/design_measurements.md, "Masked stores"), so only a partial vector takes the
// masked form.
inline void store(float* p, __mmask16 m, __m512 v) {
  if (m == __mmask16(0xFFFF)) _mm512_storeu_ps(p, v);
  else _mm512_mask_storeu_ps(p, m, v);
}
inline void store(uint16_t* p, __mmask16 m, __m256i v) {
  if (m == __mmask16(0xFFFF)) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  else _mm256_mask_storeu_epi16(p, m, v);
}
inline void store(void* p, __mmask16 m, __m128i v) {  // 16 bytes (uint8 / int8)
  if (m == __mmask16(0xFFFF)) _mm_storeu_si128(static_cast<__m128i*>(p), v);
  else _mm_mask_storeu_epi8(p, m, v);
}

// bf16 bits -> fp32 (exact), the lanes under m (0 elsewhere).
inline __m512 widen_bf16(const uint16_t* p, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// fp32 -> bf16 bits, round to nearest even (like torch's .to(torch.bfloat16)); NaN stays a quiet
// NaN instead of rounding into infinity.
inline __m256i round_bf16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i r = _mm512_mask_or_epi32(rounded, nan, b, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// The quantize formula of every qbackend op: clamp(round_half_even(x / scale), lo, hi) + zp, the
// division an IEEE fp32 division, NaN -> zp (lo = qmin - zp and hi = qmax - zp, as floats).
inline __m512i quantize(__m512 x, __m512 scale, __m512 lo, __m512 hi, __m512i zp) {
  __m512 v = _mm512_div_ps(x, scale);
  v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
  return _mm512_add_epi32(_mm512_cvtps_epi32(v), zp);
}

// e^x for x <= 0: Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, then a degree-7 Taylor
// polynomial (relative truncation error < 1e-8, plus fp32 rounding) scaled by 2^n. Below -104 the
// result is 0 (-inf included); NaN stays NaN.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // the second operand is returned when it is NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace avx512
}  // namespace
}  // namespace qbackend::kernels
