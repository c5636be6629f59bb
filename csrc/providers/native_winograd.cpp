// The native provider's Winograd route (native_winograd.h): when it applies, and the split of the
// output tiles over the threads.
#include "providers/native_winograd.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <string>

#include "cpu/probe.h"
#include "kernels/winograd_kernels.h"
#include "runtime/parallel.h"

namespace qbackend::native {
namespace {

std::atomic<bool> g_winograd{true};
std::atomic<int64_t> g_calls{0};

// Output rows and columns below which a call keeps the GEMM: the filter is 3.6 times the int8 weight's
// bytes, read once per block of tiles, and the deep layers' images are few tiles (ResNet's 512
// channels at 7 x 7: 0.65-0.68x the pair-product GEMM at batch 1, 0.9-1.16x at batch 8; 14 x 14 and
// up: 1.15-1.5x; benchmarks/results/epyc_zen3/winograd_avx2.md). The rule table's 7-bit weights
// (qbackend/dispatch/rules.py, WINOGRAD_CONV) follow the same bound.
constexpr int64_t kMinOutput = 12;
// Input channels below which the packing adds no Winograd filter: the transforms work on 16 channels
// at a time, so a stem over 1-15 channels would transform mostly padding.
constexpr int64_t kMinChannels = 16;
// Multiply-adds (of the direct conv) from which a call runs on every thread.
constexpr int64_t kParallelWork = int64_t(1) << 22;

bool avx2_gemm() { return available() && std::strcmp(gemm_kernels().name, "avx2") == 0; }

}  // namespace

bool winograd_packs(int64_t C, int64_t KH, int64_t KW, const Conv2dParams& p) {
  return g_winograd.load(std::memory_order_relaxed) && KH == 3 && KW == 3 && C >= kMinChannels &&
         C <= kernels::kWinogradMaxChannels &&
         p.stride[0] == 1 && p.stride[1] == 1 && p.dilation[0] == 1 && p.dilation[1] == 1 && avx2_gemm();
}

bool run_winograd(const kernels::GemmArgs& g, const PackedView& w, const uint8_t* x, bool x_int8, int32_t x_zp,
                  int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, const Conv2dParams& p) {
  if (!w.winograd || !g_winograd.load(std::memory_order_relaxed) || p.stride[0] != 1 || p.stride[1] != 1 ||
      p.dilation[0] != 1 || p.dilation[1] != 1 || p.padding[0] > 2 || p.padding[1] > 2 || OH < kMinOutput ||
      OW < kMinOutput || !cpu::has(cpu::Isa::Avx2))
    return false;
  kernels::WinogradArgs a;
  a.x = x, a.x_int8 = x_int8, a.x_zp = x_zp;
  a.C = C, a.H = H, a.W = W, a.OH = OH, a.OW = OW, a.ph = p.padding[0], a.pw = p.padding[1];
  a.u = w.winograd;
  const int64_t tiles = N * kernels::winograd_tiles_per_image(a);
  a.g = g;
  a.g.a_zp = 0;  // the transforms subtract x's zero point: the epilogue's colsum * a_zp term is 0
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t scratch = kernels::winograd_scratch_bytes(C);
  auto run = [&](int64_t t0, int64_t t1) { kernels::winograd_conv_avx2(a, t0, t1, conv_scratch(scratch)); };
  const int threads = N * OH * OW * g.N * 9 * C >= kParallelWork ? at::get_num_threads() : 1;
  if (threads <= 1) run(0, tiles);
  else
    parallel::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) run(tiles * t / threads, tiles * (t + 1) / threads);
    });
  return true;
}

void set_winograd(bool enabled) { g_winograd.store(enabled, std::memory_order_relaxed); }
bool winograd_enabled() { return g_winograd.load(std::memory_order_relaxed); }
int64_t winograd_calls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace qbackend::native
