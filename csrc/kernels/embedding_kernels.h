// Rowwise-quantized embedding-bag kernels (no torch headers): one table of function pointers per
// ISA, chosen at run time like the quantize kernels.
//
// Table layout ("fused rowwise", one uint8 row per embedding row):
//   [ scale ][ bias ][ data: dim bytes (8-bit) or dim/2 bytes (4-bit; element 2j in the low
//     nibble of byte j, element 2j+1 in the high nibble) ]
// with scale and bias both fp16 (4 bytes) or both fp32 (8 bytes): value = scale * q + bias.
// With fp16 qparams this is fbgemm_gpu's table-batched layout (row alignment 1), which FBGEMM's
// JIT embedding kernels also read (scale_bias_last = false).
//
// Arithmetic contract (FBGEMM's reference EmbeddingSpMDM, so the built-in kernel and
// fbgemm_gpu's give the same fp32 bits): per bag, out[d] starts at 0; for each index i of the bag
// in order (skipping padding_idx), with w = per_sample_weights[i] (or 1), s = scale * w and
// b = bias * w in fp32, out[d] = fma(s, q[d], out[d] + b); mean: out[d] *= 1.f / count when
// count > 0 (empty bags are 0). The caller validates every argument (indices in range, offsets
// non-decreasing from 0, the last one <= the number of indices).
#pragma once
#include <cstdint>

namespace qbackend::kernels {

template <typename Index>
struct EmbeddingBagArgs {
  const uint8_t* table;
  int64_t row_bytes;
  int64_t dim;
  const Index* indices;
  int64_t num_indices;
  const Index* offsets;   // bag b: [offsets[b], offsets[b + 1]) ; the last bag ends at bag_end_last
  int64_t num_bags;
  int64_t last_end;       // end of the last bag (offsets[num_bags] or num_indices)
  const float* weights;   // per_sample_weights or nullptr
  bool mean;
  int64_t padding_idx;    // -1: none
  float* out;             // [num_bags, dim]
};

// fn(args, bag_begin, bag_end) for 8/4 bits x fp16/fp32 qparams x int32/int64 indices.
template <typename Index>
using EmbeddingBagFn = void (*)(const EmbeddingBagArgs<Index>&, int64_t, int64_t);

struct EmbeddingKernels {
  const char* name;
  // [bits == 4][qparams fp32]
  EmbeddingBagFn<int32_t> bag32[2][2];
  EmbeddingBagFn<int64_t> bag64[2][2];
};

const EmbeddingKernels& embedding_kernels_avx512();
const EmbeddingKernels& embedding_kernels_avx2();
const EmbeddingKernels& embedding_kernels_scalar();

}  // namespace qbackend::kernels
