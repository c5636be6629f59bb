// Scalar (baseline x86-64) build of GPTQ's block step (gptq_kernels.h): 8 rows per group.
#include <cstdint>

#include "kernels/gptq_kernels.h"
#include "kernels/gptq_rows_impl.h"  // no target: the baseline build (SSE2; no FMA to contract)

namespace qbackend::kernels {

const GptqKernels& gptq_kernels_scalar() {
  static constexpr GptqKernels k{"scalar", &round_block_groups<8>};
  return k;
}

}  // namespace qbackend::kernels
