// Packs an int8 weight [N, K] into the native GEMM's panels (layout: gemm_kernels.h). Runs once
// per layer, at prepack: plain C++.
#include <algorithm>
#include <cstring>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {

void gemm_pack_b(const int8_t* w, int64_t N, int64_t K, int8_t* packed, int32_t* colsum) {
  const int64_t Kp = gemm_kp(K), Np = gemm_np(N);
  std::memset(packed, 0, static_cast<size_t>(Np * Kp));
  for (int64_t n = 0; n < Np; ++n) {
    int32_t s = 0;
    if (n < N)
      for (int64_t k = 0; k < K; ++k) s += w[n * K + k];
    colsum[n] = s;
  }
  for (int64_t p = 0; p * kGemmPanel < Np; ++p) {
    const int64_t n0 = p * kGemmPanel;
    const int64_t vectors = std::min<int64_t>(kGemmPanel, Np - n0) / 16;
    int8_t* panel = packed + n0 * Kp;
    for (int64_t v = 0; v < vectors; ++v)
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t n = n0 + v * 16 + c;
        if (n >= N) continue;
        const int8_t* row = w + n * K;
        for (int64_t k = 0; k < K; ++k)
          panel[((k / 4) * vectors + v) * 64 + c * 4 + (k % 4)] = row[k];
      }
  }
}

}  // namespace qbackend::kernels
