// The activation cache (contract: activation_cache.h).
#include "runtime/activation_cache.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <iterator>
#include <utility>
#include <vector>

namespace qbackend::runtime {
namespace {

constexpr size_t kRound = size_t(64) << 10;  // block sizes are multiples of 64 KiB
constexpr size_t kHeader = 64;               // the block's size, kept in front of the data (alignment 64)

size_t initial_limit() {
  const char* env = std::getenv("QBACKEND_ACTIVATION_CACHE_MB");
  if (env == nullptr || *env == '\0') return size_t(1024) << 20;
  char* end = nullptr;
  const long long mb = std::strtoll(env, &end, 10);
  return (end != env && *end == '\0' && mb >= 0) ? static_cast<size_t>(mb) << 20 : size_t(1024) << 20;
}

struct Cache {
  std::mutex mu;
  std::vector<std::pair<size_t, void*>> free_blocks;  // (block size, base pointer), in the order freed
  size_t held = 0;
  size_t limit = initial_limit();
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may be freed during interpreter exit
  return *c;
}

void give_back(void* base) {
  size_t size;
  std::memcpy(&size, base, sizeof(size));
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.held + size <= c.limit) {
      c.free_blocks.emplace_back(size, base);
      c.held += size;
      return;
    }
  }
  c10::free_cpu(base);
}

void delete_block(void* ctx) { give_back(ctx); }

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const size_t size = (n + kHeader + kRound - 1) / kRound * kRound;
    void* base = nullptr;
    {
      Cache& c = cache();
      std::lock_guard<std::mutex> lock(c.mu);
      // the most recently freed block that fits without wasting more than half of it: still in the
      // CPU's caches, where an older one would be written back from memory
      for (auto it = c.free_blocks.rbegin(); it != c.free_blocks.rend(); ++it) {
        if (it->first >= size && it->first <= 2 * size) {
          base = it->second;
          c.held -= it->first;
          c.free_blocks.erase(std::next(it).base());
          break;
        }
      }
    }
    if (base == nullptr) {
      base = c10::alloc_cpu(size);
      std::memcpy(base, &size, sizeof(size));
    }
    return {static_cast<char*>(base) + kHeader, base, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  size_t n = c10::elementSize(dtype);
  for (const int64_t s : sizes) n *= static_cast<size_t>(s);
  if (n < kMinCachedBytes || cache_limit() == 0) return at::empty(sizes, options);
  return at::detail::empty_generic(sizes, &allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   options.memory_format_opt());
}

size_t cached_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().held;
}

size_t cache_limit() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().limit;
}

void set_cache_limit(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(cache().mu);
    cache().limit = bytes;
  }
  if (cached_bytes() > bytes) release_cached();
}

void release_cached() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(cache().mu);
    for (auto& [size, block] : cache().free_blocks) blocks.push_back(block);
    cache().free_blocks.clear();
    cache().held = 0;
  }
  for (void* b : blocks) c10::free_cpu(b);
}

}  // namespace qbackend::runtime
