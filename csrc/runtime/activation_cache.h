// Output tensors of qbackend's own ops from a cache of large blocks that outlives the tensors.
//
// Why: glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh mmap
// and gives it back on free, so such an activation is page-faulted in again on every forward (a
// batch-32 MobileNetV2's 112x112x96 expansion is 38.5 MB; benchmarks/page_faults.py,
// benchmarks/results/epyc_zen5/page_faults.md). Blocks of at least kMinCachedBytes freed by their tensors are kept
// (sizes rounded up to 64 KiB); an output takes the most recently freed block of at least its size
// and at most twice it, which is likely still in the CPU's caches: an older block of its exact size
// would be written back from memory first (the first depthwise conv of each width in a batch-32
// MobileNetV2 took 1.6x the time of the next ones). At most `limit` bytes are kept
// (QBACKEND_ACTIVATION_CACHE_MB at load, default 1024; 0 turns the cache off), the rest freed.
// Smaller outputs take torch's CPU allocator as before. Thread-safe.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstddef>

namespace qbackend::runtime {

constexpr size_t kMinCachedBytes = size_t(1) << 20;

// at::empty(sizes, options) (dtype and memory format from options), its storage from the cache
// where it is large enough.
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options);

// Bytes held in the cache (not in use), and the limit; a limit below what is held frees every held
// block, as release_cached() does.
size_t cached_bytes();
size_t cache_limit();
void set_cache_limit(size_t bytes);
void release_cached();

}  // namespace qbackend::runtime
