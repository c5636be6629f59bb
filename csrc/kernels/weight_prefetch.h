// Software prefetch for the weight-only products' weight streams (woq_*.cpp, woq_a8_*.cpp): a decode
// step reads every weight once, from memory, and the hardware prefetchers alone keep too few lines
// in flight for the core's share of the read bandwidth (Intel Xeon, 2 threads: 13 GB/s of a 29.5 GB/s
// copy bandwidth). Each loop asks for the line kWeightPrefetchAhead bytes past the one it reads, into
// L2 (T1: the L2's own miss queue, not the L1's fill buffers), once per 64-byte line it reads. The
// row tiles of a product are one contiguous stream (woq_kernels.h), so the lines asked for are the
// ones a later step reads, also across tiles; past the weight's end they are dropped or wasted, never
// read. Distance measured on that Xeon (576 x 3072 int8 weights from memory, 2 threads: 1 KB
// 15.5 GB/s, 4 KB 18.0, 8 KB 19.6, 16 KB 19.3).
//
// `static inline`: each kernel unit compiles its own copy for its own target.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace qbackend::kernels {

constexpr int64_t kWeightPrefetchAhead = 8192;

static inline void prefetch_weights(const void* line) {
  _mm_prefetch(static_cast<const char*>(line) + kWeightPrefetchAhead, _MM_HINT_T1);
}

}  // namespace qbackend::kernels
