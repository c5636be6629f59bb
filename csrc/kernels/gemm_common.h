// The ISA-free parts of the native GEMM kernels (gemm_avx512_vnni_impl.h, gemm_avx2_vnni.cpp):
// the cache blocking of rows and panels, the byte loads of activation k-groups, and the GELU
// epilogue's coefficients. In an
// anonymous namespace like the kernels' own blocks, so each kernel translation unit compiles its
// own copy for its own target (no inline function is shared between units built for different ISAs).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {
namespace {

// gelu(y) = y / 2 * (1 + erf(y / sqrt 2)) with erf(y / sqrt 2) = yc * P(yc^2) / Q(yc^2), yc = y clamped
// to +-kGeluClamp (4 sqrt 2, where erf is 1 to fp32 precision): a rational minimax fit of degrees
// 6 / 4 in yc^2, highest degree first (csrc/kernels/gelu_erf_fit.py regenerates them).
constexpr float kGeluClamp = 5.656854249f;
constexpr float kGeluP[7] = {2.1232228302e-10f, -4.3981964076e-08f, 6.8744597150e-06f, 3.7950457017e-04f,
                             9.2693153737e-03f, 7.5645262124e-02f, 7.9788421476e-01f};
constexpr float kGeluQ[5] = {6.8635992193e-05f, 1.9440238470e-03f, 3.0201199650e-02f, 2.6147110534e-01f, 1.0f};

// L2 budgets (1-2 MB per core on current x86 servers): a weight up to kWeightInL2 bytes is kept
// there whole, with blocks of about kRowsInL2 bytes of activation rows.
constexpr int64_t kWeightInL2 = int64_t(512) << 10;
constexpr int64_t kRowsInL2 = int64_t(192) << 10;

inline int32_t load_a4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The n (1-3) bytes at p as the low bytes of a word, the rest 0: built in registers (a byte-wise
// copy into a stack word and a word load from it stalls store forwarding on every k-group tail).
inline int32_t load_tail(const uint8_t* p, int64_t n) {
  if (n == 1) return p[0];
  uint16_t lo;
  std::memcpy(&lo, p, 2);
  return n == 2 ? int32_t(lo) : int32_t(lo) | (int32_t(p[2]) << 16);
}

// The next panel of a sweep, which a panel_rows callback may prefetch into L2 while it runs the
// current one (its bytes: the packed weight is panel after panel, gemm_kernels.h); p is nullptr
// where nothing is worth prefetching.
struct NextPanel {
  const int8_t* p = nullptr;
  int64_t bytes = 0;
};

inline NextPanel next_panel(const GemmArgs& g, int64_t p, int64_t panel_end) {
  if (p + 1 >= panel_end) return {};
  const int64_t cols = std::min<int64_t>(kGemmPanel, g.N - (p + 1) * kGemmPanel);
  return {g.b + (p + 1) * kGemmPanel * gemm_kp(g.K), (cols + 15) / 16 * 16 * gemm_kp(g.K)};
}

// The cache blocking of rows [m_begin, m_end) x panels [panel_begin, panel_end), calling
// panel_rows(p, mb, me[, next]) for each panel and block of rows (blocks in multiples of row_tile).
// A callback that takes `next` (NextPanel) is handed the panel the sweep reads after p from memory
// or L3 (the first time it reads it): prefetching it while p runs hides that read, which otherwise
// stalls the first row tile of every panel (Intel's L3 serves one core about 20-25 GB/s, a VNNI tile
// consumes about 60). One that also takes `rows_cold` is told whether this pass reads rows
// [mb, me) from L3 or memory (the first panel over a block of rows, or every panel where the rows
// are too many to stay in L2 beside it), so that it may read the next rows ahead.
template <class PanelRows>
void sweep(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t panel_begin, int64_t panel_end,
           int64_t row_tile, PanelRows&& panel_rows) {
  auto run = [&](int64_t p, int64_t mb, int64_t me, NextPanel next, bool rows_cold) {
    if constexpr (std::is_invocable_v<PanelRows&, int64_t, int64_t, int64_t, NextPanel, bool>)
      panel_rows(p, mb, me, next, rows_cold);
    else if constexpr (std::is_invocable_v<PanelRows&, int64_t, int64_t, int64_t, NextPanel>) panel_rows(p, mb, me, next);
    else panel_rows(p, mb, me);
  };
  const int64_t Kp = gemm_kp(g.K);
  if ((panel_end - panel_begin) * kGemmPanel * Kp <= kWeightInL2) {
    // The weight's panels stay in L2: blocks of rows (about kRowsInL2 bytes of x) run over every
    // panel, so each row of x is read from memory once; the first block brings the weight in.
    const int64_t block = std::max<int64_t>(row_tile, kRowsInL2 / Kp / row_tile * row_tile);
    for (int64_t mb = m_begin; mb < m_end; mb += block)
      for (int64_t p = panel_begin; p < panel_end; ++p)
        run(p, mb, std::min(m_end, mb + block), mb == m_begin ? next_panel(g, p, panel_end) : NextPanel{},
            !g.a_cached && p == panel_begin);
  } else {
    // A large weight: one panel at a time stays in L2 while the rows stream past it.
    const bool rows_stay = (m_end - m_begin) * Kp <= kRowsInL2;
    for (int64_t p = panel_begin; p < panel_end; ++p)
      run(p, m_begin, m_end, next_panel(g, p, panel_end), !g.a_cached && (p == panel_begin || !rows_stay));
  }
}

}  // namespace
}  // namespace qbackend::kernels
