// AVX512-BF16 fused attention: q k^T and P v by vdpbf16ps on bf16 operands, fp32 accumulation and
// softmax (kernels/attention_avx512_impl.h). Only this file is compiled with avx512bf16 (pragma
// below, after the includes); call it only when qbackend::cpu::bf16_usable().

#include <immintrin.h>

#include "kernels/attention_kernels.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#define QBACKEND_ATTENTION_BF16
#include "kernels/attention_avx512_impl.h"

namespace qbackend::kernels {

void attention_rows_avx512_bf16(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                float* scratch) {
  attention_detail::rows_bf16(p, b, h, i0, i1, scratch);
}

double bf16_dot_flops_avx512(int64_t iters) {
  QB_ZMM_THROUGHPUT_LOOP(iters, "vdpbf16ps")
  return static_cast<double>(iters) * QB_ZMM_THROUGHPUT_INSNS * 32 * 2;
}

}  // namespace qbackend::kernels
