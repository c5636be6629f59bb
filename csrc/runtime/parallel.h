// qbackend's own thread pool for its kernels' parallel loops (parallel.cpp).
//
// Why: torch's OpenMP pool either busy-waits for a long time after every region (libgomp's
// default) or, with OMP_WAIT_POLICY=PASSIVE, puts its threads to sleep at once, and every region
// then pays a futex wake-up; on a virtual machine that is tens of microseconds per region (an idle
// vCPU must be woken by the host), and a BERT-base forward has about a hundred regions (measured:
// benchmarks/results/design_measurements.md, "Thread pool: sleeping OpenMP threads"). This pool
// spins briefly for the next region
// (QBACKEND_SPIN_US, default 200 us), then sleeps; the waiting caller spins, then yields.
//
// Work is split into chunks that whichever thread is free claims, so a worker that is late (asleep,
// preempted by another process) does not hold up the region: the caller takes its chunks.
//
// Which pool runs the regions (QBACKEND_THREADING): "own" (this one), "openmp" (at::parallel_for,
// torch's team), or "auto" (default): own when torch's OpenMP threads sleep between regions
// (OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0), else OpenMP: when libgomp's threads spin after
// torch's own ops, a second spinning pool would fight them for the cores (the same section).
//
// The thread count is torch's (at::get_num_threads(), torch.set_num_threads). A call from inside a
// region (ours or an OpenMP one), or while another thread is using the pool, runs serially.
#pragma once
#include <cstdint>
#include <functional>

namespace qbackend::parallel {

// Calls f(b, e) over [begin, end) in chunks of at least `grain` indices, at most one chunk per
// thread (as at::parallel_for splits). Exceptions thrown by f are rethrown in the caller (the first
// one; the other chunks still run to the end).
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

// Microseconds a worker spins for the next region before sleeping (QBACKEND_SPIN_US at load;
// 0 = sleep at once). Settable for tests and benchmarks.
int spin_us();
void set_spin_us(int us);

// Whether parallel_for uses this pool (true) or at::parallel_for (QBACKEND_THREADING, see above).
bool own_pool();
void set_own_pool(bool own);

}  // namespace qbackend::parallel
