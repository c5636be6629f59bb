// The embedding-bag kernels (embedding_impl.h) compiled for one ISA. AVX2+FMA build: call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/embedding_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX2 QB_ISA_F16C)

#include "kernels/embedding_impl.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {

const EmbeddingKernels& embedding_kernels_avx2() {
  static const EmbeddingKernels k = make_embedding_kernels("avx2");
  return k;
}

}  // namespace qbackend::kernels
