// AVX512 build (no FMA: the contract's products and sums stay apart) of GPTQ's block step (gptq_kernels.h): 32 rows per group.
#include <cstdint>

#include "kernels/gptq_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512)

QB_PRAGMA(GCC optimize("fp-contract=off"))  // the contract: products and sums apart

#include "kernels/gptq_rows_impl.h"  // after the target: compiled for it

namespace qbackend::kernels {

const GptqKernels& gptq_kernels_avx512() {
  static constexpr GptqKernels k{"avx512", &round_block_groups<32>};
  return k;
}

}  // namespace qbackend::kernels
