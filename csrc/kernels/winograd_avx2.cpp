// The Winograd F(2x2, 3x3) convolution for AVX2 CPUs (contract, bounds and packed filter:
// winograd_kernels.h). Call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
//
// Per block of tiles: each tile's 4 x 4 input window is transformed once, 16 channels a vector
// (int16), into V[xi][row][Cp]; then per 16-column vector of the output channels, 16 GEMMs (one
// per transform position xi) of the block's rows against the packed filter's channel pairs
// (vpmaddwd: 16 products per instruction where the direct conv's vpmaddubsw + vpmaddwd take two
// for 32, and Winograd needs 16 products per 4 outputs where the direct conv takes 36), into
// M[xi][row][16] (int32); then each tile's 16 sums per column become its 2 x 2 outputs
// (A^T M A / 4) and go through the GEMM kernels' epilogue one output pixel at a time.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/targets.h"
#include "kernels/asm_acc_tiles.h"
#include "kernels/gemm_kernels.h"
#include "kernels/winograd_kernels.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

constexpr int kRows = 6;  // rows (tiles) of the GEMM's register tile

// The 16 channels at c0 of a pixel (nullptr: the padding) minus the zero point, as int16; channels
// past `valid` read as 0 - zp (their packed filter is zero).
inline __m256i load_d(const uint8_t* px, int64_t c0, int64_t valid, bool i8, __m256i zp) {
  if (!px) return _mm256_setzero_si256();
  __m128i b;
  if (valid >= 16) {
    b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(px + c0));
  } else {
    alignas(16) uint8_t tmp[16] = {};
    std::memcpy(tmp, px + c0, static_cast<size_t>(valid));
    b = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_sub_epi16(i8 ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b), zp);
}

// Tile t of the batch: its image and its row and column among the image's tiles.
struct TileAt {
  int64_t n, ty, tx;
  TileAt(const WinogradArgs& a, int64_t t) {
    const int64_t TW = (a.OW + 1) / 2, per_image = winograd_tiles_per_image(a);
    n = t / per_image, ty = t % per_image / TW, tx = t % per_image % TW;
  }
};

// V = B^T d B of tile t into row `row` of V[16][TB][Cp].
void transform_tile(const WinogradArgs& a, int64_t t, int16_t* V, int64_t TB, int64_t Cp, int64_t row) {
  const auto [n, ty, tx] = TileAt(a, t);
  const uint8_t* px[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int64_t iy = 2 * ty - a.ph + i, ix = 2 * tx - a.pw + j;
      px[i][j] = iy >= 0 && iy < a.H && ix >= 0 && ix < a.W ? a.x + ((n * a.H + iy) * a.W + ix) * a.C : nullptr;
    }
  const __m256i zp = _mm256_set1_epi16(static_cast<int16_t>(a.x_zp));
  for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
    const int64_t valid = a.C - c0;
    __m256i s[4][4];
    for (int j = 0; j < 4; ++j) {  // B^T d: the rows
      const __m256i d0 = load_d(px[0][j], c0, valid, a.x_int8, zp), d1 = load_d(px[1][j], c0, valid, a.x_int8, zp);
      const __m256i d2 = load_d(px[2][j], c0, valid, a.x_int8, zp), d3 = load_d(px[3][j], c0, valid, a.x_int8, zp);
      s[0][j] = _mm256_sub_epi16(d0, d2);
      s[1][j] = _mm256_add_epi16(d1, d2);
      s[2][j] = _mm256_sub_epi16(d2, d1);
      s[3][j] = _mm256_sub_epi16(d1, d3);
    }
    for (int i = 0; i < 4; ++i) {  // (B^T d) B: the columns
      const __m256i v[4] = {_mm256_sub_epi16(s[i][0], s[i][2]), _mm256_add_epi16(s[i][1], s[i][2]),
                            _mm256_sub_epi16(s[i][2], s[i][1]), _mm256_sub_epi16(s[i][1], s[i][3])};
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(V + ((4 * i + j) * TB + row) * Cp + c0), v[j]);
    }
  }
}

// The sums of 6 rows of V (row stride ldv bytes) x one 16-column vector of the packed filter over
// `pairs` channel pairs, stored to out (int32, 16 per row, rows 64 bytes apart). In assembly for the
// same reason as the GEMM kernels' full tiles: 12 accumulators (ymm0-11), the pair's two filter
// vectors (ymm12-13), a row's broadcast pair (ymm14) and a product (ymm15). Each pair also prefetches
// the filter's line 2 KB on (the filter is one stream, read from memory by a block's
// first row tile: the deep layers' filters are megabytes).
void dot_6x16(const int16_t* v, int64_t ldv, const int16_t* u, int64_t pairs, int32_t* out) {
  const char* r0 = reinterpret_cast<const char*>(v);
  const char* r3 = r0 + 3 * ldv;
  __asm__ volatile(
      QB_ASM_LOOP_BEGIN_ACC12("%[n]")
      "vmovdqu (%[u]), %%ymm12\n\t"
      "vmovdqu 32(%[u]), %%ymm13\n\t"
      "prefetcht0 2048(%[u])\n\t"
      "add $64, %[u]\n\t"
#define QB_WINO_ROW(ADDR, A0, A1)                                                   \
      "vpbroadcastd " ADDR ", %%ymm14\n\t"                                          \
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%" A0 ", %%" A0 "\n\t" \
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%" A1 ", %%" A1 "\n\t"
      QB_WINO_ROW("(%[r0])", "ymm0", "ymm1")
      QB_WINO_ROW("(%[r0],%[s],1)", "ymm2", "ymm3")
      QB_WINO_ROW("(%[r0],%[s],2)", "ymm4", "ymm5")
      QB_WINO_ROW("(%[r3])", "ymm6", "ymm7")
      QB_WINO_ROW("(%[r3],%[s],1)", "ymm8", "ymm9")
      QB_WINO_ROW("(%[r3],%[s],2)", "ymm10", "ymm11")
#undef QB_WINO_ROW
      "add $4, %[r0]\n\t"
      "add $4, %[r3]\n\t"
      QB_ASM_LOOP_END_ACC12("%[n]", "%[out]")
      : [u] "+r"(u), [r0] "+r"(r0), [r3] "+r"(r3), [n] "+r"(pairs)
      : [s] "r"(ldv), [out] "r"(out)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

// Tile t's 2 x 2 outputs of the 16 columns at n16 from M[16][TB][16] row `row`, through the epilogue
// (its folded form with the vector's terms where `terms` is not null).
void output_tile(const WinogradArgs& a, int64_t t, const int32_t* M, int64_t TB, int64_t row, int64_t n16,
                 const FoldedConsts& consts, const FoldedTerms* terms) {
  const auto [n, ty, tx] = TileAt(a, t);
  __m256i y[4][2];  // [pixel 2i + j][half]
  for (int h = 0; h < 2; ++h) {
    __m256i m[16];
    for (int xi = 0; xi < 16; ++xi)
      m[xi] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(M + (xi * TB + row) * 16 + h * 8));
    __m256i t0[4], t1[4];  // A^T m: wrapping int32 sums (winograd_kernels.h)
    for (int j = 0; j < 4; ++j) {
      t0[j] = _mm256_add_epi32(_mm256_add_epi32(m[j], m[4 + j]), m[8 + j]);
      t1[j] = _mm256_sub_epi32(_mm256_sub_epi32(m[4 + j], m[8 + j]), m[12 + j]);
    }
    const __m256i* tr[2] = {t0, t1};
    for (int i = 0; i < 2; ++i) {
      const __m256i* q = tr[i];
      y[2 * i][h] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), q[2]), 2);
      y[2 * i + 1][h] = _mm256_srai_epi32(_mm256_sub_epi32(_mm256_sub_epi32(q[1], q[2]), q[3]), 2);
    }
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const int64_t oh = 2 * ty + i, ow = 2 * tx + j;
      if (oh >= a.OH || ow >= a.OW) continue;
      const int64_t m = (n * a.OH + oh) * a.OW + ow;
      if (terms) epilogue_folded<1>(a.g, consts, *terms, y[2 * i + j], m, n16);
      else epilogue<1>(a.g, y[2 * i + j], m, n16);
    }
}

// L2 budgets (see winograd_conv_avx2): the transformed tiles of a large block (32 x Cp bytes a tile),
// of a small one, and the vectors of the filter a group keeps in L2 beside the small blocks (512 x
// Cp bytes a 16-column vector).
constexpr int64_t kOneBlockBytes = int64_t(256) << 10;
constexpr int64_t kBlockBytes = int64_t(128) << 10;
constexpr int64_t kFilterGroupBytes = int64_t(192) << 10;

int64_t block_tiles(int64_t C, int64_t bytes) {
  return std::clamp<int64_t>(bytes / (32 * winograd_cp(C)) / kRows * kRows, kRows, 96);
}

}  // namespace

int64_t winograd_block_tiles(int64_t C) { return block_tiles(C, kOneBlockBytes); }

int64_t winograd_scratch_bytes(int64_t C) {
  const int64_t TB = winograd_block_tiles(C);
  return 16 * TB * winograd_cp(C) * 2 + 16 * TB * 16 * 4;
}

void winograd_conv_avx2(const WinogradArgs& a, int64_t t_begin, int64_t t_end, uint8_t* scratch) {
  const int64_t Cp = winograd_cp(a.C), pairs = Cp / 2, tiles = t_end - t_begin;
  const int64_t NV = gemm_np(a.g.N) / 16, vector_bytes = 512 * Cp;
  // Every block reads the filter's vectors it computes. Blocks of the larger budget where the tiles
  // make at most two (the filter read once or twice: ResNet's 256-channel convs at 14 x 14, batch 1)
  // or where fewer than two of the filter's vectors fit the group budget (over 192 channels: the
  // tiles would be transformed again for every vector); else blocks of the smaller budget, in groups
  // of the filter's vectors that fit it (all of them from 64 channels down), each group over every
  // block: the group stays in L2 beside the blocks, and the tiles are transformed once per group (a
  // few percent of the products) where a filter read per block took longer than the products
  // (ResNet's 128-channel convs: 0.5 MB, 13 blocks at 28 x 28).
  const int64_t big = winograd_block_tiles(a.C), fit = kFilterGroupBytes / vector_bytes;
  const bool large_blocks = tiles <= 2 * big || fit < 2;
  const int64_t TB = large_blocks ? big : block_tiles(a.C, kBlockBytes);
  const int64_t group = large_blocks ? NV : fit;
  const bool folded = requantizes_without_gelu(a.g);
  const FoldedConsts consts = folded ? folded_consts(a.g) : FoldedConsts{};
  int16_t* V = reinterpret_cast<int16_t*>(scratch);
  int32_t* M = reinterpret_cast<int32_t*>(scratch + 16 * TB * Cp * 2);
  // Blocks of equal size (49 tiles in two blocks: 25 each, rather than 30 and 19).
  const int64_t blocks = (tiles + TB - 1) / TB;
  const int64_t per_block = blocks ? (tiles + blocks - 1) / blocks : 0;
  for (int64_t v0 = 0; v0 < NV; v0 += group) {
    for (int64_t tb = t_begin; tb < t_end; tb += per_block) {
      const int64_t nt = std::min(per_block, t_end - tb), rows = (nt + kRows - 1) / kRows * kRows;
      for (int64_t r = 0; r < nt; ++r) transform_tile(a, tb + r, V, TB, Cp, r);
      for (int xi = 0; xi < 16; ++xi)  // the rows that complete the last register tile: zero
        std::memset(V + (xi * TB + nt) * Cp, 0, static_cast<size_t>((rows - nt) * Cp * 2));
      for (int64_t v = v0; v < std::min(NV, v0 + group); ++v) {
        for (int xi = 0; xi < 16; ++xi) {
          const int16_t* u = a.u + (v * 16 + xi) * pairs * 32;
          for (int64_t r = 0; r < rows; r += kRows)
            dot_6x16(V + (xi * TB + r) * Cp, Cp * 2, u, pairs, M + (xi * TB + r) * 16);
        }
        const bool full = folded && v * 16 + 16 <= a.g.N;  // a whole vector: its folded terms once
        const FoldedTerms terms = full ? folded_terms(a.g, v * 16) : FoldedTerms{};
        for (int64_t r = 0; r < nt; ++r) output_tile(a, tb + r, M, TB, r, v * 16, consts, full ? &terms : nullptr);
      }
    }
  }
}

}  // namespace qbackend::kernels
