// Whether bf16 dot products pay on this CPU. AVX512-BF16's vdpbf16ps does twice the multiply-adds
// of an fp32 FMA per instruction; AMD's Zen 4/5 issue it as often as an FMA, Intel's Xeons far less
// often, so there bf16 products would slow the attention down (benchmarks/results/
// design_measurements.md, "bf16 dot products"). Measured once per process.
#pragma once
#include <string>

namespace qbackend::cpu {

// True where bf16_usable() and the bf16 dot product's measured fp32-operation rate is at least 1.25x
// the FMA's (or the policy says "on"). About 1 ms the first time it is asked.
bool bf16_products_pay();
// The two rates (GFLOP/s on this thread), measured on each call (0 for bf16 without AVX512-BF16).
double fma_gflops();
double bf16_dot_gflops();
// "auto" (measured; the default, or QBACKEND_BF16_PRODUCTS=auto), "on" (wherever bf16_usable(): to
// test the bf16 paths on any AVX512-BF16 CPU), "off". Raises std::invalid_argument on anything else.
void set_bf16_products_policy(const std::string& policy);
std::string bf16_products_policy();

}  // namespace qbackend::cpu
