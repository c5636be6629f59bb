// The embedding-bag kernels (embedding_impl.h) compiled for one ISA. AVX512 build: call only when qbackend::cpu::usable_level() >= 2.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/embedding_kernels.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "kernels/embedding_impl.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {

const EmbeddingKernels& embedding_kernels_avx512() {
  static const EmbeddingKernels k = make_embedding_kernels("avx512");
  return k;
}

}  // namespace qbackend::kernels
