// The direct convolution on AMX-INT8 tiles (contract and layout: gemm_kernels.h, DirectConvArgs),
// for the hardware tiles and the emulated ones (amx_tiles_impl.h).
//
// A band of output rows is one GEMM over its input's phase planes (stride 1: the zero-point-padded
// rows): row q of the GEMM is output pixel (oh0 + q / Wq, q % Wq), and the k's of tap (kh, kw),
// channels c..c + 63, are the bytes of one plane's pixel at a constant offset from q, so an A tile
// (16 consecutive q's x 64 channels) is loaded in place with the pixel stride C and no tap is ever
// gathered. The columns q % Wq >= OW (the kernel's reach past the output) and the q's past the band
// are computed and not stored: 2 of every 58 rows for a 3x3 over 56 x 56, 1 of 29 at stride 2.
// Blocks of 32 q's x 32 columns; each 32-column block of the weight runs over a group of q-blocks
// (direct_rows) while the group's input rows stay in L1. Sums and epilogue are the GEMM's
// (gemm_avx512_vnni_impl.h), each row's output written at its pixel: the same bytes as the GEMM
// over gathered taps.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AMX)

#include "kernels/amx_tiles_impl.h"  // after the pragma: compiled for this target
#include "kernels/gemm_avx512_vnni_impl.h"

namespace qbackend::kernels {
namespace {

static_assert(kDirectConvRowBlock == kBlockRows, "direct_plane_pixels reserves one block of the kernel's q's");

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

// One block: q's q0.. (RT x 16 of them) x CT x 16 columns (vectors v0.. of panel p, which has nvp).
template <class T, int RT, int CT, bool I8>
void direct_block(const DirectConvArgs& a, const uint8_t* buf, const TapOffsets& taps, int64_t q0, int64_t p,
                  int64_t v0, int64_t nvp, const int64_t* out_row) {
  const GemmArgs& g = a.g;
  const int64_t ldb = nvp * 64, C = a.C, ntaps = a.KH * a.KW;
  const int8_t* B = g.b + p * kGemmPanel * gemm_kp(g.K) + v0 * 64;
  const uint8_t* base = buf + q0 * C;
  const int64_t a1 = kTileRows * C;
  zero_block<T, RT, CT>();
  const int8_t* bk = B;
  for (int64_t t = 0; t < ntaps; ++t) {
    const uint8_t* tap = base + taps.pixel[t] * C;
    for (int64_t c = 0; c < C; c += kTileBytes, bk += kTileRows * ldb) block_step<T, RT, CT, I8>(tap + c, a1, C, bk, ldb);
  }
  alignas(64) __m512i sums[RT * kTileRows * CT];
  store_block<T, RT, CT>(sums);
  epilogue_mapped<RT * kTileRows, CT>(g, sums, out_row, p * kGemmPanel + v0 * 16, g.a_zp - (I8 ? 128 : 0));
}

// q-blocks per group: each 32-column block of the weight runs over a group of q-blocks before the
// next, so that its tiles are read from L2 (or memory) once per group. Weights up to kSmallWeight
// bytes stay in L1 anyway and take groups of one, which keep the block's input rows in L1 for the
// whole weight instead (AMX Xeon, 1 thread, 16 images: 3x3 64 -> 64 @56 2% slower in groups of 4;
// 128 -> 128 @28 5% faster, 512 -> 512 @7 20% faster, 256 -> 256 @14 level).
constexpr int kGroupBlocks = 4;
constexpr int64_t kSmallWeight = int64_t(64) << 10;

template <class T, bool I8>
void direct_rows(const DirectConvArgs& a, int64_t n, int64_t oh0, int64_t rows, int64_t panel_begin, int64_t panel_end,
                 const uint8_t* buf) {
  const GemmArgs& g = a.g;
  const int64_t Wq = direct_plane_width(a), q_count = rows * Wq;
  const TapOffsets taps(a, rows);
  int64_t out_row[kGroupBlocks][kBlockRows];
  int64_t oh = 0, ow = 0;  // of the next q, advanced q by q (no division per row)
  const int group = g.N * g.K <= kSmallWeight ? 1 : kGroupBlocks;
  for (int64_t g0 = 0; g0 < q_count; g0 += group * kBlockRows) {
    const int blocks = static_cast<int>(std::min<int64_t>(group, (q_count - g0 + kBlockRows - 1) / kBlockRows));
    for (int b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < kBlockRows; ++r) {
        const int64_t q = g0 + b * kBlockRows + r;
        out_row[b][r] = q < q_count && ow < a.OW ? (n * a.OH + oh0 + oh) * a.OW + ow : -1;
        if (++ow == Wq) ow = 0, ++oh;
      }
    for (int64_t p = panel_begin; p < panel_end; ++p) {
      const int64_t nvp = (std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel) + 15) / 16;
      for (int64_t v = 0; v < nvp; v += 2) {
        const bool two_cols = nvp - v >= 2;
        for (int b = 0; b < blocks; ++b) {
          const int64_t q0 = g0 + b * kBlockRows;
          const bool two_rows = q_count - q0 > kTileRows;
          if (two_rows && two_cols) direct_block<T, 2, 2, I8>(a, buf, taps, q0, p, v, nvp, out_row[b]);
          else if (two_rows) direct_block<T, 2, 1, I8>(a, buf, taps, q0, p, v, nvp, out_row[b]);
          else if (two_cols) direct_block<T, 1, 2, I8>(a, buf, taps, q0, p, v, nvp, out_row[b]);
          else direct_block<T, 1, 1, I8>(a, buf, taps, q0, p, v, nvp, out_row[b]);
        }
      }
    }
  }
}

template <class T>
void direct_conv(const DirectConvArgs& a, int64_t n, int64_t oh_begin, int64_t oh_end, int64_t panel_begin,
                 int64_t panel_end, uint8_t* scratch) {
  if (oh_end <= oh_begin || panel_end <= panel_begin) return;
  fill_planes(a, n, oh_begin, oh_end - oh_begin, scratch);
  T::configure(tile_config());
  struct Release {
    ~Release() { T::release(); }  // also when the emulation raises
  } release;
  if (a.g.a_int8) direct_rows<T, true>(a, n, oh_begin, oh_end - oh_begin, panel_begin, panel_end, scratch);
  else direct_rows<T, false>(a, n, oh_begin, oh_end - oh_begin, panel_begin, panel_end, scratch);
}

}  // namespace

DirectConvFn direct_conv_amx() { return &direct_conv<HwTiles>; }
DirectConvFn direct_conv_amx_emulated() { return &direct_conv<EmuTiles>; }

}  // namespace qbackend::kernels
