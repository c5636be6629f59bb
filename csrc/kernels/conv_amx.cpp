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
#include "kernels/direct_conv_impl.h"

namespace qbackend::kernels {
namespace {

static_assert(kDirectConvRowBlock == kBlockRows, "direct_plane_pixels reserves one block of the kernel's q's");

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
