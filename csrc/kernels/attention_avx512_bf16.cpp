// AVX512-BF16 fused attention: q k^T and P v by vdpbf16ps on bf16 operands, fp32 accumulation and
// softmax (kernels/attention_avx512_impl.h). Only this file is compiled with avx512bf16 (pragma
// below, after the includes); call it only when qbackend::cpu::bf16_usable().

#include <immintrin.h>

#include "kernels/attention_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512 QB_ISA_BF16)
#include "kernels/attention_avx512_impl.h"

namespace qbackend::kernels {
namespace {
namespace attention_detail {
// ---- bf16 products ----

// n values of a row (fp32 or bf16) times mul, rounded to bf16, into dst; dst[n] = 0 if n is odd.
inline void bf16_row(const void* src, AttnIn in, int64_t n, float mul, uint16_t* dst) {
  const __m512 s = _mm512_set1_ps(mul);
  for (int64_t i = 0; i < n; i += W) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = in == AttnIn::f32 ? _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i)
                                       : widen_bf16(static_cast<const uint16_t*>(src) + i, m);
    store(dst + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(x, s)));
  }
  if (n & 1) dst[n] = 0;
}

struct BF16Products {
  using Word = uint32_t;
  static __m512bh load(const uint32_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  // The packed v (vt) is zero-padded to whole vectors: the tail needs no mask.
  static __m512bh load(const uint32_t* p, __mmask16) { return load(p); }
  static __m512bh broadcast(uint32_t x) { return (__m512bh)_mm512_set1_epi32(int(x)); }
  static __m512 madd(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

inline void rows_bf16(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1, float* scratch) {
  const int64_t Skp = round_up(std::max<int64_t>(p.Sk, 1), W), Dh = (p.D + 1) / 2, Sh = (p.Sk + 1) / 2;
  const int64_t Dvp = round_up(p.Dv, W);
  const int64_t esz = in_elem_size(p.in);
  uint32_t* kt = reinterpret_cast<uint32_t*>(scratch);
  uint32_t* vt = kt + Dh * Skp;
  uint32_t* qp = vt + Sh * Dvp;
  float* s = reinterpret_cast<float*>(qp + R * Dh);
  uint32_t* pp = reinterpret_cast<uint32_t*>(s + R * Skp);
  float* inv = reinterpret_cast<float*>(pp + R * Sh);
  uint32_t* row = reinterpret_cast<uint32_t*>(inv + R);  // one k row, or two v rows, in bf16

  const char* kbase = static_cast<const char*>(p.k) + (b * p.k_sb + h * p.k_sh) * esz;
  for (int64_t j = 0; j < p.Sk; ++j) {  // row j of k as bf16 pairs -> column j of kt
    bf16_row(kbase + j * p.k_si * esz, p.in, p.D, 1.0f, reinterpret_cast<uint16_t*>(row));
    for (int64_t d = 0; d < Dh; ++d) kt[d * Skp + j] = row[d];
  }
  for (int64_t d = 0; d < Dh; ++d) std::fill(kt + d * Skp + p.Sk, kt + (d + 1) * Skp, 0u);

  const char* vbase = static_cast<const char*>(p.v) + (b * p.v_sb + h * p.v_sh) * esz;
  uint16_t* v2 = reinterpret_cast<uint16_t*>(row);  // rows j and j + 1 of v in bf16, side by side
  for (int64_t jh = 0; jh < Sh; ++jh) {
    const int64_t j = 2 * jh;
    bf16_row(vbase + j * p.v_si * esz, p.in, p.Dv, 1.0f, v2);
    if (j + 1 < p.Sk) bf16_row(vbase + (j + 1) * p.v_si * esz, p.in, p.Dv, 1.0f, v2 + Dvp);
    else std::fill(v2 + Dvp, v2 + Dvp + p.Dv, uint16_t(0));
    uint32_t* out = vt + jh * Dvp;
    for (int64_t e = 0; e < p.Dv; ++e) out[e] = uint32_t(v2[e]) | (uint32_t(v2[Dvp + e]) << 16);
    std::fill(out + p.Dv, out + Dvp, 0u);
  }

  const char* qbase = static_cast<const char*>(p.q) + (b * p.q_sb + h * p.q_sh) * esz;
  char* obase = static_cast<char*>(p.out) + (b * p.o_sb + h * p.o_sh) * out_elem_size(p.out_kind);
  for (int64_t ib = i0; ib < i1; ib += R) {
    const int rows = int(std::min<int64_t>(R, i1 - ib));
    for (int r = 0; r < R; ++r) {
      if (r < rows) bf16_row(qbase + (ib + r) * p.q_si * esz, p.in, p.D, p.scale, reinterpret_cast<uint16_t*>(qp + r * Dh));
      else std::fill(qp + r * Dh, qp + (r + 1) * Dh, 0u);
    }
    qk_block<BF16Products>(qp, Dh, kt, Skp, s);
    for (int r = 0; r < R; ++r) {
      inv[r] = r < rows ? softmax_row(p, b, h, ib + r, s + r * Skp) : 0.0f;
      if (r < rows) bf16_row(s + r * Skp, AttnIn::f32, p.Sk, 1.0f, reinterpret_cast<uint16_t*>(pp + r * Sh));
      else std::fill(pp + r * Sh, pp + (r + 1) * Sh, 0u);
    }
    pv_block<BF16Products>(p, obase, ib, rows, pp, Sh, Sh, vt, Dvp, inv);
  }
}

}  // namespace attention_detail
}  // namespace

void attention_rows_avx512_bf16(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                float* scratch) {
  attention_detail::rows_bf16(p, b, h, i0, i1, scratch);
}

double bf16_dot_flops_avx512(int64_t iters) {
  QB_ZMM_THROUGHPUT_LOOP(iters, "vdpbf16ps")
  return static_cast<double>(iters) * QB_ZMM_THROUGHPUT_INSNS * 32 * 2;
}

}  // namespace qbackend::kernels
