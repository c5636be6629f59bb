// Packs an int8 weight [N, K] into the native GEMM's panels (layout: gemm_kernels.h), and a 3x3
// filter into the Winograd conv's transformed one (winograd_kernels.h). Runs once per layer, at
// prepack: plain C++.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/gemm_kernels.h"
#include "kernels/winograd_kernels.h"

namespace qbackend::kernels {
namespace {
std::atomic<bool> g_rows_read_ahead{true};
}  // namespace

bool rows_read_ahead() { return g_rows_read_ahead.load(std::memory_order_relaxed); }
void set_rows_read_ahead(bool enabled) { g_rows_read_ahead.store(enabled, std::memory_order_relaxed); }

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

namespace qbackend::kernels {

void winograd_pack(const int8_t* w, int64_t N, int64_t C, int16_t* u) {
  // U = (2G) g (2G)^T per (output, input) channel (winograd_kernels.h), at its packed position.
  static constexpr int G2[4][3] = {{2, 0, 0}, {1, 1, 1}, {1, -1, 1}, {0, 0, 2}};
  const int64_t Cp = winograd_cp(C), pairs = Cp / 2;
  std::fill(u, u + winograd_packed_elems(N, C), int16_t(0));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const int8_t* g = w + (n * C + c) * 9;
      int t[4][3];  // (2G) g
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < 3; ++b) t[i][b] = G2[i][0] * g[b] + G2[i][1] * g[3 + b] + G2[i][2] * g[6 + b];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const int val = t[i][0] * G2[j][0] + t[i][1] * G2[j][1] + t[i][2] * G2[j][2];
          u[((n / 16 * 16 + 4 * i + j) * pairs + c / 2) * 32 + (n % 16) * 2 + c % 2] = static_cast<int16_t>(val);
        }
    }
}

}  // namespace qbackend::kernels
