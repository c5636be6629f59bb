// AVX512 (F/BW/VL/DQ) fused attention with fp32 products (kernels/attention_avx512_impl.h). Only
// this file is compiled for AVX512 (pragma below, after the includes); call it only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512).

#include <immintrin.h>

#include "kernels/attention_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512)
#include "kernels/attention_avx512_impl.h"

namespace qbackend::kernels {

size_t attention_scratch_floats(const AttentionProblem& p) {
  return p.bf16_products ? attention_detail::scratch_words_bf16(p) : attention_detail::scratch_words_f32(p);
}

void attention_rows_avx512(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1, float* scratch) {
  attention_detail::rows_f32(p, b, h, i0, i1, scratch);
}

double fma_flops_avx512(int64_t iters) {
  QB_ZMM_THROUGHPUT_LOOP(iters, "vfmadd231ps")
  return static_cast<double>(iters) * QB_ZMM_THROUGHPUT_INSNS * 16 * 2;
}

}  // namespace qbackend::kernels
