// bf16_products_pay(): the rates of an fp32 FMA loop and a bf16 dot-product loop (kernels in the
// attention translation units, compiled for their targets), compared once.
#include "cpu/bf16_speed.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "cpu/probe.h"
#include "kernels/attention_kernels.h"

namespace qbackend::cpu {
namespace {

enum Policy : int { kAuto = 0, kOn = 1, kOff = 2 };

int parse(const std::string& s) {
  if (s == "auto" || s.empty()) return kAuto;
  if (s == "on") return kOn;
  if (s == "off") return kOff;
  throw std::invalid_argument("the bf16 products policy must be 'auto', 'on' or 'off', got '" + s + "'");
}

std::atomic<int>& policy() {
  static std::atomic<int> p{[] {
    const char* env = std::getenv("QBACKEND_BF16_PRODUCTS");
    try {
      return env ? parse(env) : kAuto;
    } catch (const std::invalid_argument&) {
      return static_cast<int>(kAuto);  // a bad value in the environment: the measured choice
    }
  }()};
  return p;
}

// Best of 5 runs of a loop of about 0.1 ms (the fastest run is the least disturbed one).
double best_gflops(double (*loop)(int64_t)) {
  constexpr int64_t kIters = 2500;
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    const double ops = loop(kIters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, ops / s / 1e9);
  }
  return best;
}

}  // namespace

double fma_gflops() { return has(Isa::Avx512) ? best_gflops(&kernels::fma_flops_avx512) : 0.0; }

double bf16_dot_gflops() { return bf16_usable() ? best_gflops(&kernels::bf16_dot_flops_avx512) : 0.0; }

bool bf16_products_pay() {
  if (!bf16_usable()) return false;
  switch (policy().load(std::memory_order_relaxed)) {
    case kOn: return true;
    case kOff: return false;
    default: break;
  }
  static const bool pays = [] {
    const double fma = fma_gflops(), dot = bf16_dot_gflops();
    return dot >= 1.25 * fma;
  }();
  return pays;
}

void set_bf16_products_policy(const std::string& p) { policy().store(parse(p), std::memory_order_relaxed); }

std::string bf16_products_policy() {
  switch (policy().load(std::memory_order_relaxed)) {
    case kOn: return "on";
    case kOff: return "off";
    default: return "auto";
  }
}

}  // namespace qbackend::cpu
