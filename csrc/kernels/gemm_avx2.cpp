// The native int8 GEMM for AVX2 CPUs without VNNI (contract and packed layout: gemm_kernels.h).
// Call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
//
// Exact at 8 bits: the u8 x s8 products are never formed by vpmaddubsw (whose int16 pair sums
// saturate from 255 * 127 * 2 > 32767). The activation rows of a tile are widened once per panel to
// int16 (a small per-thread buffer, zero past K), the weight's packed bytes are widened to int16 as
// they are read, and vpmaddwd multiplies int16 pairs into int32 lanes: each pair sum is at most
// 2 * 255 * 128 = 65280 in magnitude, and the int32 accumulation is exact for K <= 65536 as on the
// VNNI kernels (|sum| <= 65536 * 255 * 128 < 2**31).
//
// The same packed panels as the VNNI kernels (so a packed weight runs on any of them): one 8-column
// half of a panel's 16-column vector and one k-group is 32 bytes, column c's 4 k's at 4c. Its first
// 16 bytes (columns 0-3) and last 16 (columns 4-7) widen to two int16 vectors; vpmaddwd against the
// row's 4 widened k's (broadcast) gives each column's two partial sums in adjacent lanes, which one
// vphaddd and a qword permute put in column order after the K loop. Register tiles are up to 6 rows
// x 8 columns (12 accumulators, 2 weight registers, a broadcast and a product: all 16 ymm registers;
// the full tile's K loop is written in assembly, dot_half_6rows); the epilogue is the AVX-VNNI
// kernel's (gemm_avx2_vnni_impl.h), on the tile's two halves.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/asm_acc_tiles.h"
#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QB_TARGET(QB_ISA_AVX2)

#include <immintrin.h>  // after the pragma: the intrinsics are compiled for this target

#include "kernels/gemm_avx2_vnni_impl.h"

namespace qbackend::kernels {
namespace {

constexpr int kRowsS16 = 6;

// Rows [m0, m0 + mr) of x as int16 (int8 x read as uint8: x ^ 0x80), each Kp long, zero past K.
void widen_rows(const GemmArgs& g, int64_t m0, int mr, int16_t* dst, int64_t Kp) {
  const uint8_t f = g.a_int8 ? 0x80 : 0;
  const __m128i flip = _mm_set1_epi8(static_cast<char>(f));
  for (int r = 0; r < mr; ++r) {
    const uint8_t* src = g.a + (m0 + r) * g.lda;
    int16_t* d = dst + r * Kp;
    int64_t k = 0;
    for (; k + 16 <= g.K; k += 16) {
      const __m128i b = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)), flip);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + k), _mm256_cvtepu8_epi16(b));
    }
    for (; k < g.K; ++k) d[k] = static_cast<int16_t>(static_cast<uint8_t>(src[k] ^ f));
    for (; k < Kp; ++k) d[k] = 0;
  }
}

// The K loop of a full 6-row tile: 12 accumulators (ymm0-11, row r's in 2r and 2r + 1), the two
// widened weight vectors (ymm12-13), a row's broadcast k's (ymm14) and a product (ymm15): all 16
// registers. Written out because the compiler spills accumulators of this loop inside it (from 10
// accumulators on), which halves its speed. Stores the raw accumulators to acc[0..11].
inline void dot_half_6rows(const int16_t* as, int64_t Kp, const int8_t* B, int64_t ldb, __m256i* acc) {
  int64_t n = Kp / 4;  // k-groups
  const int64_t stride = Kp * 2;  // bytes between widened rows
  const char* r0 = reinterpret_cast<const char*>(as);
  const char* r3 = r0 + 3 * stride;
  __asm__ volatile(
      QB_ASM_LOOP_BEGIN_ACC12("%[n]")
      "vpmovsxbw (%[b]), %%ymm12\n\t"
      "vpmovsxbw 16(%[b]), %%ymm13\n\t"
      "add %[ldb], %[b]\n\t"
      "vpbroadcastq (%[r0]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm0, %%ymm0\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm1, %%ymm1\n\t"
      "vpbroadcastq (%[r0],%[s],1), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm2, %%ymm2\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm3, %%ymm3\n\t"
      "vpbroadcastq (%[r0],%[s],2), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm4, %%ymm4\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm5, %%ymm5\n\t"
      "vpbroadcastq (%[r3]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm6, %%ymm6\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm7, %%ymm7\n\t"
      "vpbroadcastq (%[r3],%[s],1), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm8, %%ymm8\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm9, %%ymm9\n\t"
      "vpbroadcastq (%[r3],%[s],2), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm10, %%ymm10\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n\t vpaddd %%ymm15, %%ymm11, %%ymm11\n\t"
      "add $8, %[r0]\n\t"
      "add $8, %[r3]\n\t"
      QB_ASM_LOOP_END_ACC12("%[n]", "%[acc]")
      : [b] "+r"(B), [r0] "+r"(r0), [r3] "+r"(r3), [n] "+r"(n)
      : [ldb] "r"(ldb), [s] "r"(stride), [acc] "r"(acc)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

// The int32 sums of MR rows x 8 columns (out[r * 2], column order) over all k-groups. as: the rows
// widened (row stride Kp); B: the half's first k-group; ldb: the byte step to the next k-group.
template <int MR>
__attribute__((always_inline)) inline void dot_half(const int16_t* as, int64_t Kp, const int8_t* B, int64_t ldb,
                                                    __m256i* out) {
  __m256i acc[MR][2];
  if constexpr (MR == 6) {
    dot_half_6rows(as, Kp, B, ldb, &acc[0][0]);
  } else {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int64_t groups = Kp / 4;
  for (int64_t k4 = 0; k4 < groups; ++k4) {
    const int8_t* bp = B + k4 * ldb;
    const __m256i w03 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bp)));
    const __m256i w47 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 16)));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      long long q;
      std::memcpy(&q, as + r * Kp + k4 * 4, 8);
      const __m256i av = _mm256_set1_epi64x(q);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(av, w03));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(av, w47));
    }
  }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    // acc[r][0] lanes: c0 c0 c1 c1 | c2 c2 c3 c3; acc[r][1]: c4..c7 alike. hadd: c0 c1 c4 c5 | c2 c3 c6 c7.
    const __m256i s = _mm256_hadd_epi32(acc[r][0], acc[r][1]);
    out[r * 2] = _mm256_permute4x64_epi64(s, 0xD8);
  }
}

// One tile: MR rows (m0.., widened in as) x vector v (its bytes at vb, step ldb) starting at column n16.
template <int MR>
void tile_s16(const GemmArgs& g, const int16_t* as, int64_t Kp, int64_t m0, const int8_t* vb, int64_t ldb,
              int64_t n16) {
  __m256i half[2][MR * 2];
  dot_half<MR>(as, Kp, vb, ldb, half[0]);
  __m256i sums[MR * 2];
  if (n16 + 8 < g.N) {
    dot_half<MR>(as, Kp, vb + 32, ldb, half[1]);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) sums[r * 2 + 1] = half[1][r * 2];
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) sums[r * 2 + 1] = _mm256_setzero_si256();  // past N: not stored
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) sums[r * 2] = half[0][r * 2];
  epilogue<MR>(g, sums, m0, n16);
}

using TileS16 = void (*)(const GemmArgs&, const int16_t*, int64_t, int64_t, const int8_t*, int64_t, int64_t);

template <int... R>
constexpr auto s16_table(std::integer_sequence<int, R...>) {
  return std::array<TileS16, sizeof...(R)>{&tile_s16<R + 1>...};
}

constexpr std::array<TileS16, kRowsS16> kTiles = s16_table(std::make_integer_sequence<int, kRowsS16>{});

void gemm_avx2(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t panel_begin, int64_t panel_end) {
  const int64_t Kp = gemm_kp(g.K);
  thread_local std::vector<int16_t> rows;
  if (static_cast<int64_t>(rows.size()) < kRowsS16 * Kp) rows.resize(kRowsS16 * Kp);
  int16_t* as = rows.data();
  sweep(g, m_begin, m_end, panel_begin, panel_end, kRowsS16, [&](int64_t p, int64_t mb, int64_t me) {
    const int64_t nvp = (std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel) + 15) / 16;
    const int8_t* panel = g.b + p * kGemmPanel * Kp;
    for (int64_t m = mb; m < me; m += kRowsS16) {
      const int mr = static_cast<int>(std::min<int64_t>(kRowsS16, me - m));
      widen_rows(g, m, mr, as, Kp);  // once per panel and row tile: ~2% of the tile's work
      const TileS16 f = kTiles[mr - 1];
      for (int64_t v = 0; v < nvp; ++v) f(g, as, Kp, m, panel + v * 64, nvp * 64, p * kGemmPanel + v * 16);
    }
  });
}

double peak_loop(int64_t iters) {
  // 12 independent accumulators, each a vpmaddwd (16 int16 multiply-adds) and a vpaddd: the
  // kernel's inner step without its loads.
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        ".rept 4\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm0, %%ymm0\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm1, %%ymm1\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm2, %%ymm2\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm3, %%ymm3\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm4, %%ymm4\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm5, %%ymm5\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm6, %%ymm6\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm7, %%ymm7\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm8, %%ymm8\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm9, %%ymm9\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t vpaddd %%ymm12, %%ymm10, %%ymm10\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t vpaddd %%ymm13, %%ymm11, %%ymm11\n\t"
        ".endr\n\t" ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
              "xmm12", "xmm13");
  }
  return static_cast<double>(iters) * 48 * 16 * 2;
}

}  // namespace

const GemmKernels& gemm_kernels_avx2() {
  static const GemmKernels k{"avx2", &gemm_avx2, kRowsS16, &peak_loop};
  return k;
}

}  // namespace qbackend::kernels
