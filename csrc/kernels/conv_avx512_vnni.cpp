// The direct convolution on AVX512-VNNI register tiles (contract and layout: gemm_kernels.h,
// DirectConvArgs). Call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx512Vnni).
//
// A band of output rows is one GEMM over its input's phase planes (direct_conv_impl.h): output
// pixel (oh0 + y, x) is plane pixel q = y * Wq + x, and the k's of tap (kh, kw) are the bytes of one
// plane's pixel at a constant offset from q, so each row of a register tile reads its 4-byte
// k-groups in place, tap after tap, where the gathered-taps GEMM first copies KH x KW x C bytes per
// output pixel into a block of rows. Tiles of up to 6 consecutive output pixels x 64 columns (each
// row with its own plane pixel, so a tile runs across a row's end and no column past the output is
// computed) accumulate with vpdpbusd over every tap and channel (the GEMM's K order: tap, then
// channel), then the GEMM's own epilogue writes the tile's consecutive output rows. The same sums
// and epilogue as the gathered taps, so the same output bytes.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512_VNNI)

#include "kernels/gemm_avx512_vnni_impl.h"  // after the pragma: compiled for this target
#include "kernels/direct_conv_impl.h"

namespace qbackend::kernels {
namespace {

// Tiles (of kMaxRows output pixels) per group: each panel of the weight runs over the group's tiles
// before the next panel, so the group's input rows stay in L1 while the panels stream.
constexpr int kGroupTiles = 8;

// The sums of an MR x (NV * 16) tile over every tap and channel: row r reads tap t's k-groups at
// row[r] + tap_pixel[t] * C (row[r]: the plane pixel of its output pixel for tap 0); B at the panel's
// first vector of the tile, ldb bytes per k-group.
template <int MR, int NV, bool I8>
__attribute__((always_inline)) inline void direct_dot(const uint8_t* const* row, int64_t C, const int64_t* tap_pixel,
                                                      int64_t taps, const int8_t* B, int64_t ldb, __m512i* out) {
  const int32_t flip = I8 ? static_cast<int32_t>(0x80808080u) : 0;
  Acc acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = Acc{};
  const uint8_t* rp[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) rp[r] = row[r];
  const int8_t* bp = B;
  for (int64_t t = 0; t < taps; ++t) {
    const int64_t off = tap_pixel[t] * C;
#pragma GCC unroll 4
    for (int64_t c = 0; c < C; c += 4, bp += ldb) {
      __m512i bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(bp + v * 64);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512i av = _mm512_set1_epi32(load_a4(rp[r] + off + c) ^ flip);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = (Acc)_mm512_dpbusd_epi32((__m512i)acc[r][v], av, bv[v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_si512(out + r * NV + v, (__m512i)acc[r][v]);
}

// One tile: output rows m0..m0 + MR (consecutive pixels; row[r] their planes' pixels) x the NV
// vectors of panel p, sums and the GEMM's epilogue.
template <int MR, int NV, bool I8>
void direct_tile(const DirectConvArgs& a, const uint8_t* const* row, const TapOffsets& taps, int64_t m0, int64_t p) {
  const GemmArgs& g = a.g;
  alignas(64) __m512i sums[MR * NV];
  direct_dot<MR, NV, I8>(row, a.C, taps.pixel, a.KH * a.KW, g.b + p * kGemmPanel * gemm_kp(g.K), NV * 64, sums);
  epilogue<MR, NV>(g, sums, m0, p * kGemmPanel, g.a_zp);
}

using DirectTileFn = void (*)(const DirectConvArgs&, const uint8_t* const*, const TapOffsets&, int64_t, int64_t);

template <bool I8, int NV, int... R>
constexpr auto direct_row_table(std::integer_sequence<int, R...>) {
  return std::array<DirectTileFn, sizeof...(R)>{&direct_tile<R + 1, NV, I8>...};
}

template <bool I8>
struct DirectTiles {
  // [NV - 1][MR - 1]
  static constexpr std::array<std::array<DirectTileFn, kMaxRows>, 4> table = {
      direct_row_table<I8, 1>(std::make_integer_sequence<int, kMaxRows>{}),
      direct_row_table<I8, 2>(std::make_integer_sequence<int, kMaxRows>{}),
      direct_row_table<I8, 3>(std::make_integer_sequence<int, kMaxRows>{}),
      direct_row_table<I8, 4>(std::make_integer_sequence<int, kMaxRows>{})};
};

// Output rows [oh0, oh0 + rows) of image n: its pixels in order, kMaxRows to a tile (a tile may run
// across an output row's end: each of its rows has its own plane pixel, so no column past the
// output is computed), every panel of [panel_begin, panel_end).
template <bool I8>
void direct_rows(const DirectConvArgs& a, int64_t n, int64_t oh0, int64_t rows, int64_t panel_begin, int64_t panel_end,
                 const uint8_t* buf) {
  const GemmArgs& g = a.g;
  const int64_t Wq = direct_plane_width(a), pixels = rows * a.OW, m_base = (n * a.OH + oh0) * a.OW;
  const TapOffsets taps(a, rows);
  const uint8_t* row[kGroupTiles][kMaxRows];
  int64_t oh = 0, ow = 0;  // of the next pixel, advanced pixel by pixel (no division per row)
  for (int64_t i0 = 0; i0 < pixels; i0 += kGroupTiles * kMaxRows) {
    const int tiles = static_cast<int>(std::min<int64_t>(kGroupTiles, (pixels - i0 + kMaxRows - 1) / kMaxRows));
    for (int b = 0; b < tiles; ++b)
      for (int r = 0; r < kMaxRows; ++r) {
        row[b][r] = buf + (oh * Wq + ow) * a.C;  // past the band's last pixel: in the plane, never stored
        if (++ow == a.OW) ow = 0, ++oh;
      }
    for (int64_t p = panel_begin; p < panel_end; ++p) {
      const int64_t nvp = (std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel) + 15) / 16;
      for (int b = 0; b < tiles; ++b) {
        const int64_t m0 = i0 + b * kMaxRows, mr = std::min<int64_t>(kMaxRows, pixels - m0);
        DirectTiles<I8>::table[nvp - 1][mr - 1](a, row[b], taps, m_base + m0, p);
      }
    }
  }
}

void direct_conv(const DirectConvArgs& a, int64_t n, int64_t oh_begin, int64_t oh_end, int64_t panel_begin,
                 int64_t panel_end, uint8_t* scratch) {
  if (oh_end <= oh_begin || panel_end <= panel_begin) return;
  fill_planes(a, n, oh_begin, oh_end - oh_begin, scratch);
  if (a.g.a_int8) direct_rows<true>(a, n, oh_begin, oh_end - oh_begin, panel_begin, panel_end, scratch);
  else direct_rows<false>(a, n, oh_begin, oh_end - oh_begin, panel_begin, panel_end, scratch);
}

}  // namespace

DirectConvFn direct_conv_avx512_vnni() { return &direct_conv; }

}  // namespace qbackend::kernels
