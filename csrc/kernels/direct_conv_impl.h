// What the kernels' direct convolutions (contract and layout: gemm_kernels.h, DirectConvArgs) share:
// the band's input copied into its phase planes and each tap's offset in them; and the GEMM's
// epilogue (gemm_avx512_vnni_impl.h) with each row written to its own output pixel, for tiles whose
// rows run over the planes' padded width (AMX's). Included, after
// gemm_avx512_vnni_impl.h and the translation unit's `QB_TARGET` (cpu/targets.h), by conv_amx.cpp
// (the AMX tiles) and conv_avx512_vnni.cpp (the VNNI register tiles): everything is in an anonymous
// namespace, so each compiles its own copy for its own target.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {
namespace {

// Copies the input of output rows [oh0, oh0 + rows) of image n into its phase planes at buf
// (DirectConvArgs), the zero point's byte wherever a plane's pixel lies in the padding or past it;
// planes no tap reads (a 1x1 kernel at stride 2 reads one of four) are left as they are.
void fill_planes(const DirectConvArgs& a, int64_t n, int64_t oh0, int64_t rows, uint8_t* buf) {
  const int64_t C = a.C, Wq = direct_plane_width(a), plane = direct_plane_pixels(a, rows);
  const int64_t prows = rows + (a.KH - 1) * a.dh / a.sh;
  const uint8_t* image = a.x + n * a.H * a.W * C;
  auto read = [](int64_t phase, int64_t taps, int64_t dilation, int64_t stride) {  // does a tap read this phase?
    for (int64_t k = 0; k < taps; ++k)
      if (k * dilation % stride == phase) return true;
    return false;
  };
  for (int64_t py = 0; py < a.sh; ++py)
    for (int64_t px = 0; px < a.sw; ++px) {
      if (!read(py, a.KH, a.dh, a.sh) || !read(px, a.KW, a.dw, a.sw)) continue;  // a plane no tap reads
      uint8_t* base = buf + (py * a.sw + px) * plane * C;
      // the plane's columns inside the image: iw = sw * X + px - pw in [0, W)
      const int64_t x_lo = std::min(Wq, std::max<int64_t>(0, (a.pw - px + a.sw - 1) / a.sw));
      const int64_t x_hi = std::max(x_lo, std::min(Wq, (a.W + a.pw - px + a.sw - 1) / a.sw));
      for (int64_t y = 0; y < prows; ++y) {
        uint8_t* d = base + y * Wq * C;
        const int64_t ih = a.sh * (oh0 + y) + py - a.ph;
        if (ih < 0 || ih >= a.H || x_lo == x_hi) {
          std::memset(d, a.pad, static_cast<size_t>(Wq * C));
          continue;
        }
        std::memset(d, a.pad, static_cast<size_t>(x_lo * C));
        const uint8_t* src = image + (ih * a.W + a.sw * x_lo + px - a.pw) * C;
        if (a.sw == 1) std::memcpy(d + x_lo * C, src, static_cast<size_t>((x_hi - x_lo) * C));
        else
          for (int64_t x = x_lo; x < x_hi; ++x, src += a.sw * C) std::memcpy(d + x * C, src, static_cast<size_t>(C));
        std::memset(d + x_hi * C, a.pad, static_cast<size_t>((Wq - x_hi) * C));
      }
      std::memset(base + prows * Wq * C, a.pad, static_cast<size_t>((plane - prows * Wq) * C));
    }
}

// Each tap's first pixel for q = 0, from the scratch's start (DirectConvArgs), in the weight's
// k order (kh, then kw).
struct TapOffsets {
  int64_t pixel[kDirectConvMaxTaps];

  TapOffsets(const DirectConvArgs& a, int64_t rows) {
    const int64_t Wq = direct_plane_width(a), plane = direct_plane_pixels(a, rows);
    for (int64_t kh = 0; kh < a.KH; ++kh)
      for (int64_t kw = 0; kw < a.KW; ++kw) {
        const int64_t p = (kh * a.dh % a.sh) * a.sw + kw * a.dw % a.sw;
        pixel[kh * a.KW + kw] = p * plane + kh * a.dh / a.sh * Wq + kw * a.dw / a.sw;
      }
  }
};

// Integer output, every column vector full: requant_rows's arithmetic (add_residual, requant_q in
// gemm_avx512_vnni_impl.h) row by row, each row to its own output row, with the per-column terms in
// registers across the rows and the residual / output type known at compile time.
template <int MR, int NV, bool RES, bool U8>
void requant_mapped(const GemmArgs& g, const __m512i* sums, const int64_t* out_row, int64_t n_base,
                    const RequantColumn* col) {
  const RequantOutput o(g);
  const __m512 q_lo = o.q_lo, q_hi = o.q_hi, r2 = o.r2;
  const __m512i out_zp = o.out_zp, r_zp = _mm512_set1_epi32(g.r_zp);
  __m512i zp_colsum[NV];
  __m512 s2[NV], b2[NV];
  for (int v = 0; v < NV; ++v) zp_colsum[v] = col[v].zp_colsum, s2[v] = col[v].s2, b2[v] = col[v].b2;
  const int64_t ldc = g.ldc, ldr = g.ldr;
  const bool r_int8 = g.r_int8;
  uint8_t* const out = static_cast<uint8_t*>(g.out) + n_base;
  const uint8_t* const res = RES ? g.r + n_base : nullptr;
  for (int r = 0; r < MR; ++r) {
    const int64_t m = out_row[r];
    if (m < 0) continue;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r * NV + v], zp_colsum[v])), s2[v], b2[v]);
      if constexpr (RES)
        t = add_residual(t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(res + m * ldr + v * 16)), r_int8, r_zp, r2);
      const __m512i q = requant_q(t, q_lo, q_hi, out_zp);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + m * ldc + v * 16),
                       U8 ? _mm512_cvtusepi32_epi8(q) : _mm512_cvtsepi32_epi8(q));
    }
  }
}

// The epilogue of an MR x (NV * 16) block whose row r goes to output row out_row[r] (< 0: dropped).
template <int MR, int NV>
void epilogue_mapped(const GemmArgs& g, const __m512i* sums, const int64_t* out_row, int64_t n_base, int32_t a_zp) {
  if (requantizes_without_gelu(g)) {
    RequantColumn col[NV];
    bool full = true;
    for (int v = 0; v < NV; ++v) {
      col[v] = RequantColumn(g, n_base + v * 16, a_zp, true);
      full = full && col[v].mask == static_cast<__mmask16>(0xffff);
    }
    const bool u8 = g.out_type == GemmOut::u8;
    if (full && g.r) {
      if (u8) requant_mapped<MR, NV, true, true>(g, sums, out_row, n_base, col);
      else requant_mapped<MR, NV, true, false>(g, sums, out_row, n_base, col);
      return;
    }
    if (full) {
      if (u8) requant_mapped<MR, NV, false, true>(g, sums, out_row, n_base, col);
      else requant_mapped<MR, NV, false, false>(g, sums, out_row, n_base, col);
      return;
    }
    const RequantOutput o(g);
    for (int v = 0; v < NV; ++v)
      for (int r = 0; r < MR; ++r)
        if (out_row[r] >= 0) requant_rows<1, NV>(g, sums + r * NV, v, out_row[r], n_base + v * 16, col[v], o);
    return;
  }
  for (int r = 0; r < MR; ++r)
    if (out_row[r] >= 0) epilogue<1, NV>(g, sums + r * NV, out_row[r], n_base, a_zp);
}

}  // namespace
}  // namespace qbackend::kernels
