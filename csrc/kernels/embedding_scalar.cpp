// The embedding-bag kernels (embedding_impl.h) compiled for one ISA. Portable build (no ISA extension): for CPUs without AVX2.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/embedding_kernels.h"

#include "kernels/embedding_impl.h"  // compiled for the baseline ISA

namespace qbackend::kernels {

const EmbeddingKernels& embedding_kernels_scalar() {
  static const EmbeddingKernels k = make_embedding_kernels("scalar");
  return k;
}

}  // namespace qbackend::kernels
