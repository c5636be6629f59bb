// qbackend's thread pool (see parallel.h).
//
// One region at a time: the caller publishes a job (a generation number, the chunk count and the
// function), wakes sleeping workers, and claims chunks itself like any worker. Chunks are claimed
// through one 64-bit word, (generation << 32) | next chunk, so a worker that saw an old
// generation can never claim a chunk of a newer job. The caller returns when every chunk has
// completed. Workers spin for spin_us, then sleep on the generation (a futex); the caller waits
// for the last chunks spinning, then yielding.
#include "runtime/parallel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qbackend::parallel {
namespace {

constexpr uint64_t kClosed = 0xffffffffu;  // chunk index no job reaches: claims are closed

int initial_spin_us() {
  const char* s = std::getenv("QBACKEND_SPIN_US");
  if (s == nullptr || *s == '\0') return 200;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return (end != s && *end == '\0' && v >= 0) ? static_cast<int>(std::min<long>(v, 1000000)) : 200;
}

std::atomic<int> g_spin_us{initial_spin_us()};

bool equals_ignoring_case(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b)
    if (std::tolower(static_cast<unsigned char>(*a)) != std::tolower(static_cast<unsigned char>(*b))) return false;
  return *a == *b;
}

// QBACKEND_THREADING=own|openmp|auto (default auto: own when torch's OpenMP threads sleep between
// regions, i.e. OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0, as libgomp read them at load).
bool initial_own_pool() {
  const char* mode = std::getenv("QBACKEND_THREADING");
  if (mode != nullptr && equals_ignoring_case(mode, "own")) return true;
  if (mode != nullptr && equals_ignoring_case(mode, "openmp")) return false;
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spincount = std::getenv("GOMP_SPINCOUNT");
  return (policy != nullptr && equals_ignoring_case(policy, "passive")) ||
         (spincount != nullptr && std::strcmp(spincount, "0") == 0);
}

std::atomic<bool> g_own_pool{initial_own_pool()};
thread_local bool t_in_region = false;

// Spins on `pred` for up to spin_us microseconds; true if it held within that time. Every 64
// pauses it yields the core, so that a runnable thread waiting for it (another pool's worker:
// oneDNN's convolutions run on torch's OpenMP team) gets it at once rather than after the spin
// (benchmarks/results/design_measurements.md, "Thread pool: yielding while spinning").
template <class Pred>
bool spin_until(Pred pred) {
  const int us = g_spin_us.load(std::memory_order_relaxed);
  if (us <= 0) return pred();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::yield();
  }
}

class Pool {
 public:
  // Runs the job on the caller and the first `workers` workers; the caller holds `submit`.
  void run(int64_t begin, int64_t end, int64_t chunk, int64_t nchunks, int workers,
           const std::function<void(int64_t, int64_t)>& f) {
    while (static_cast<int>(threads_.size()) < workers) {
      const int index = static_cast<int>(threads_.size());
      const uint32_t seen = generation_.load(std::memory_order_acquire);
      threads_.emplace_back([this, index, seen] { worker(index, seen); });
      threads_.back().detach();  // never joined: the pool lives as long as the process
    }
    const uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store((uint64_t(g) << 32) | kClosed, std::memory_order_release);
    f_.store(&f, std::memory_order_relaxed);
    begin_.store(begin, std::memory_order_relaxed);
    end_.store(end, std::memory_order_relaxed);
    chunk_.store(chunk, std::memory_order_relaxed);
    nchunks_.store(nchunks, std::memory_order_relaxed);
    workers_.store(workers, std::memory_order_relaxed);
    completed_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    claim_.store(uint64_t(g) << 32, std::memory_order_release);
    generation_.store(g, std::memory_order_release);
    generation_.notify_all();  // a syscall only when a worker sleeps

    run_chunks(g);
    // The chunks left are running on workers: spin, then yield the core (a worker preempted by
    // another process may need it) rather than sleep, as a futex wake-up costs more than most chunks.
    if (!spin_until([&] { return completed_.load(std::memory_order_acquire) == nchunks; }))
      while (completed_.load(std::memory_order_acquire) != nchunks) std::this_thread::yield();
    if (error_) std::rethrow_exception(error_);
  }

  std::mutex submit;

 private:
  void worker(int index, uint32_t seen) {
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      uint32_t g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) generation_.wait(seen);
      seen = g;
      if (index < workers_.load(std::memory_order_relaxed)) run_chunks(g);
    }
  }

  // Claims and runs chunks of generation g until none is left (or a newer job has begun).
  void run_chunks(uint32_t g) {
    const int64_t nchunks = nchunks_.load(std::memory_order_relaxed);
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      int64_t k;
      for (;;) {
        if ((c >> 32) != g) return;
        k = static_cast<int64_t>(c & 0xffffffffu);
        if (k >= nchunks) return;
        if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) break;
      }
      const int64_t b = begin_.load(std::memory_order_relaxed) + k * chunk_.load(std::memory_order_relaxed);
      const int64_t e = std::min(end_.load(std::memory_order_relaxed), b + chunk_.load(std::memory_order_relaxed));
      t_in_region = true;
      try {
        (*f_.load(std::memory_order_relaxed))(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      t_in_region = false;
      completed_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint64_t> claim_{kClosed};
  std::atomic<int64_t> completed_{0};
  std::atomic<const std::function<void(int64_t, int64_t)>*> f_{nullptr};
  std::atomic<int64_t> begin_{0}, end_{0}, chunk_{1}, nchunks_{0};
  std::atomic<int> workers_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_atfork_once;

// A forked child has none of the parent's worker threads (and maybe a held mutex): it starts a
// fresh pool. The old one is leaked, as its threads' stacks belong to the parent.
void reset_after_fork() { g_pool.store(nullptr, std::memory_order_relaxed); }

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, reset_after_fork); });
  Pool* fresh = new Pool();
  if (g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *p;
}

}  // namespace

int spin_us() { return g_spin_us.load(std::memory_order_relaxed); }

void set_spin_us(int us) { g_spin_us.store(std::max(0, us), std::memory_order_relaxed); }

bool own_pool() { return g_own_pool.load(std::memory_order_relaxed); }

void set_own_pool(bool own) { g_own_pool.store(own, std::memory_order_relaxed); }

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  if (begin >= end) return;
  if (!own_pool()) {
    at::parallel_for(begin, end, grain, f);
    return;
  }
  const int64_t n = end - begin;
  grain = std::max<int64_t>(1, grain);
  const int threads = (t_in_region || at::in_parallel_region()) ? 1 : std::max(1, at::get_num_threads());
  const int64_t chunk = std::max(grain, (n + threads - 1) / threads);
  const int64_t nchunks = (n + chunk - 1) / chunk;
  if (nchunks <= 1) {
    f(begin, end);
    return;
  }
  Pool& p = pool();
  std::unique_lock<std::mutex> lock(p.submit, std::try_to_lock);
  if (!lock.owns_lock()) {  // another thread's region is running: do this one here
    f(begin, end);
    return;
  }
  p.run(begin, end, chunk, nchunks, static_cast<int>(std::min<int64_t>(threads, nchunks)) - 1, f);
}

}  // namespace qbackend::parallel
