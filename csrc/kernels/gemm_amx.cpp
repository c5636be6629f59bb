// The native int8 GEMM (contract and packed layout: gemm_kernels.h) on AMX-INT8 tiles, plus the
// same kernel over emulated tiles for testing on CPUs without AMX.
//
// Blocks of 32 rows x 32 columns (or 16 of either where fewer remain) accumulate in four int32 C
// tiles (tiles 0-3, C[i][j] = 2 i + j) from two A tiles (4, 5: 16 rows x 64 k's of the activation,
// loaded in place with the row stride) and two B tiles (6, 7: 16 k-groups x 16 columns of a
// panel, loaded in place from the packed weight: a B tile row is one k-group of one 16-column
// vector, 64 bytes, and the next k-group is 64 x the panel's vectors further on). Every tile is
// 16 rows x 64 bytes, one configuration per call and thread.
//
// What the tiles do not cover runs on the AVX512-VNNI code of gemm_avx512_vnni_impl.h (every AMX
// CPU has AVX512-VNNI): the last K % 64 k's (added to the tiles' sums, never reading past a row or
// the packed weight), the last M % 16 rows, and GEMMs with K < 64 or fewer than 16 rows. Signed
// activations use tdpbssd (s8 x s8), so their sums are taken against zero point - 128.
//
// The tile instructions sit behind two interchangeable classes: HwTiles (the instructions) and
// EmuTiles (a C++ model of them, following the instructions' definitions, that also checks the
// shapes the hardware checks). The kernel template is compiled for both, so the emulated kernel
// runs the AMX kernel's blocking, configuration and remainders on this CPU. Before the hardware
// kernel is used, gemm_amx_self_check compares it with the VNNI kernel (native_gemm.cpp).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/probe.h"
#include "kernels/gemm_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AMX)

#include "kernels/amx_tiles_impl.h"         // after the pragma: compiled for this target
#include "kernels/gemm_avx512_vnni_impl.h"

namespace qbackend::kernels {
namespace {

// Adds the last K - kmain k's (fewer than 64) of rows m0.. x CT vectors to sums, on VNNI register
// tiles. For signed activations the VNNI code reads the bytes as uint8 (a ^ 0x80), which adds
// 128 x the weight's sum over those k's: subtracted, so that sums stay sums of signed products.
template <int ROWS, int CT, bool I8>
void add_k_tail(const GemmArgs& g, __m512i* sums, int64_t m0, const int8_t* B, int64_t ldb, int64_t kmain) {
  const int64_t kt = g.K - kmain;
  const int8_t* bt = B + kmain / 4 * ldb;
  __m512i corr[CT];
  for (int j = 0; j < CT; ++j) corr[j] = _mm512_setzero_si512();
  if constexpr (I8) {
    static const std::array<uint8_t, 64> ones = [] {
      std::array<uint8_t, 64> o{};
      o.fill(1);
      return o;
    }();
    __m512i colsum[CT];
    dot_tile<1, CT, false>(ones.data(), 0, bt, ldb, kt, colsum);
    for (int j = 0; j < CT; ++j) corr[j] = _mm512_slli_epi32(colsum[j], 7);
  }
  for (int r = 0; r < ROWS; r += 4) {
    __m512i t[4 * CT];
    dot_tile<4, CT, I8>(g.a + (m0 + r) * g.lda + kmain, g.lda, bt, ldb, kt, t);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < CT; ++j)
        sums[(r + i) * CT + j] = _mm512_sub_epi32(_mm512_add_epi32(sums[(r + i) * CT + j], t[i * CT + j]), corr[j]);
  }
}

// One block of RT x 16 rows (m0..) and CT x 16 columns (vectors v0.. of panel p, which has nvp).
// (Kept out of line, as amx_block4: inlined into amx_panel_rows, the blocks measured 3-5% slower.)
template <class T, int RT, int CT, bool I8>
__attribute__((noinline)) void amx_block(const GemmArgs& g, int64_t m0, int64_t p, int64_t v0, int64_t nvp, int64_t kmain) {
  const int64_t ldb = nvp * 64;
  const int8_t* B = g.b + p * kGemmPanel * gemm_kp(g.K) + v0 * 64;
  const uint8_t* a = g.a + m0 * g.lda;
  const int64_t a1 = kTileRows * g.lda;
  zero_block<T, RT, CT>();
  for (int64_t k = 0; k < kmain; k += kTileBytes) block_step<T, RT, CT, I8>(a + k, a1, g.lda, B + k / 4 * ldb, ldb);
  alignas(64) __m512i sums[RT * kTileRows * CT];
  store_block<T, RT, CT>(sums);
  if (kmain < g.K) add_k_tail<RT * kTileRows, CT, I8>(g, sums, m0, B, ldb, kmain);
  epilogue<RT * kTileRows, CT>(g, sums, m0, p * kGemmPanel + v0 * 16, g.a_zp - (I8 ? 128 : 0));
}

// The requantizing epilogue of the 64-column blocks (integer output without gelu): a row's 64
// columns at once, the values rounded as requant_q (gemm_avx512_vnni_impl.h) rounds them, then
// narrowed by two saturating packs (int32 -> int16, out_zp added in int16, -> 8 bit) and put back in
// column order by one dword permutation: one 64-byte store, and half the narrowing instructions of
// four vpmov[u]sdb. The bytes are requant_rows' bytes: the packs' saturation is the clamp to the
// output type's range, relu's floor is a byte maximum with out_zp, and only the upper bound is
// applied in float, which keeps cvtps_epi32 from its overflow result (INT_MIN). A value below the
// range rounds to at most q_lo (or to INT_MIN) and saturates to q_min; NaN (min's second operand)
// converts to INT_MIN, q_min, which requant_q's clamp also gives. The sums arrive corrected: the
// tiles start from zc = - a_zp x colsum (the columns' zp_colsum, negated). Applies where the panel
// has all 64 columns and out_zp lies in the output type's range (`requant64_applies`). The VNNI
// register tiles keep the 16-column epilogue: with their 24 accumulators in registers, these 16
// vectors of terms spill, and the 1x1 convs over 64 channels measured 3-5% slower there
// (benchmarks/results/xeon_amx/wide_requant_ab.md).
struct Requant64 {
  __m512 s2[4], b2[4];
  __m512 q_hi, r2;
  __m512i r_zp, zp16, floor8;
  alignas(64) int32_t zc[kGemmPanel];  // every C tile row's starting sums, column by column

  Requant64() = default;
  Requant64(const GemmArgs& g, int64_t n_base, int32_t a_zp) {
    const RequantOutput o(g);
    for (int v = 0; v < 4; ++v) {
      const RequantColumn c(g, n_base + v * 16, a_zp, true);
      s2[v] = c.s2;
      b2[v] = c.b2;
      _mm512_store_si512(zc + v * 16, _mm512_sub_epi32(_mm512_setzero_si512(), c.zp_colsum));
    }
    q_hi = o.q_hi;
    r2 = o.r2;
    r_zp = _mm512_set1_epi32(g.r_zp);
    zp16 = _mm512_set1_epi16(static_cast<int16_t>(g.out_zp));
    floor8 = _mm512_set1_epi8(static_cast<char>(g.out_zp));
  }
};

bool requant64_applies(const GemmArgs& g, int64_t n_base) {
  if (!requantizes_without_gelu(g) || n_base + 64 > g.N) return false;
  return g.out_type == GemmOut::u8 ? g.out_zp >= 0 && g.out_zp <= 255 : g.out_zp >= -128 && g.out_zp <= 127;
}

// One row: corrected int32 sums s[0..3], the residual row res (RES), the 64 output bytes to out.
template <bool RES, bool U8, bool RELU>
__attribute__((always_inline)) inline void requant_row64(const Requant64& t, const __m512i* s, uint8_t* out,
                                                         const uint8_t* res, bool r_int8) {
  __m512i q[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[v]), t.s2[v], t.b2[v]);
    if constexpr (RES)
      y = add_residual(y, _mm_loadu_si128(reinterpret_cast<const __m128i*>(res + v * 16)), r_int8, t.r_zp, t.r2);
    q[v] = _mm512_cvtps_epi32(_mm512_min_ps(t.q_hi, y));
  }
  const __m512i lo = _mm512_adds_epi16(_mm512_packs_epi32(q[0], q[1]), t.zp16);
  const __m512i hi = _mm512_adds_epi16(_mm512_packs_epi32(q[2], q[3]), t.zp16);
  __m512i b = U8 ? _mm512_packus_epi16(lo, hi) : _mm512_packs_epi16(lo, hi);
  if constexpr (RELU) b = U8 ? _mm512_max_epu8(b, t.floor8) : _mm512_max_epi8(b, t.floor8);
  // byte lane l of vector v sits in dword 4 l + v (the packs work within 128-bit lanes)
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi32(order, b));
}

template <bool RES, bool U8, bool RELU, int MR>
void requant_rows64(const GemmArgs& g, const __m512i* sums, int64_t m0, int64_t n_base, const Requant64& t) {
  uint8_t* const out = static_cast<uint8_t*>(g.out) + m0 * g.ldc + n_base;
  const uint8_t* const res = RES ? g.r + m0 * g.ldr + n_base : nullptr;
  const int64_t ldc = g.ldc, ldr = g.ldr;
  const bool r_int8 = g.r_int8;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    requant_row64<RES, U8, RELU>(t, sums + r * 4, out + r * ldc, RES ? res + r * ldr : nullptr, r_int8);
}

// Rows m0 .. m0 + MR of 4 full vectors of corrected sums (sums[r * 4 + v]), columns n_base...
template <int MR>
void requant64(const GemmArgs& g, const __m512i* sums, int64_t m0, int64_t n_base, const Requant64& t) {
  const bool u8 = g.out_type == GemmOut::u8, relu = g.post == GemmPost::relu;
  if (g.r) {
    if (u8) relu ? requant_rows64<true, true, true, MR>(g, sums, m0, n_base, t)
                 : requant_rows64<true, true, false, MR>(g, sums, m0, n_base, t);
    else relu ? requant_rows64<true, false, true, MR>(g, sums, m0, n_base, t)
              : requant_rows64<true, false, false, MR>(g, sums, m0, n_base, t);
  } else {
    if (u8) relu ? requant_rows64<false, true, true, MR>(g, sums, m0, n_base, t)
                 : requant_rows64<false, true, false, MR>(g, sums, m0, n_base, t);
    else relu ? requant_rows64<false, false, true, MR>(g, sums, m0, n_base, t)
              : requant_rows64<false, false, false, MR>(g, sums, m0, n_base, t);
  }
}

// One block of RT x 16 rows (m0..) and a whole panel p of 64 columns with the 64-column requantizing
// epilogue (requant64_applies): the tiles start from t.zc (- a_zp x colsum), so the epilogue has no
// correction to subtract; the panel's two 32-column halves accumulate one after the other into one
// row-major array of 4 vectors per row.
template <class T, int RT, bool I8>
__attribute__((noinline)) void amx_block4(const GemmArgs& g, int64_t m0, int64_t p, int64_t kmain, const Requant64& t) {
  constexpr int64_t ldb = 4 * 64;
  const int8_t* B = g.b + p * kGemmPanel * gemm_kp(g.K);
  const uint8_t* a = g.a + m0 * g.lda;
  const int64_t a1 = kTileRows * g.lda;
  alignas(64) __m512i sums[RT * kTileRows * 4];
  for (int h = 0; h < 2; ++h) {
    const int8_t* Bh = B + h * 128;
    init_block<T, RT, 2>(t.zc + 32 * h);
    for (int64_t k = 0; k < kmain; k += kTileBytes) block_step<T, RT, 2, I8>(a + k, a1, g.lda, Bh + k / 4 * ldb, ldb);
    store_block<T, RT, 2>(sums + 2 * h, ldb);
  }
  if (kmain < g.K) add_k_tail<RT * kTileRows, 4, I8>(g, sums, m0, B, ldb, kmain);
  requant64<RT * kTileRows>(g, sums, m0, p * kGemmPanel, t);
}

// Rows [mb, me) of panel p: blocks of 32 (then 16) rows on the tiles, the rest on VNNI. A panel
// whose 64 columns all take the 64-column epilogue runs whole blocks (amx_block4) up to K =
// kWideMaxK, where the epilogue weighs most; from K = 512 the blocks of 32 columns measured 3%
// faster (1x1 512 -> 128 and 512 -> 256 @28, batch 32, AMX Xeon, 2 threads).
constexpr int64_t kWideMaxK = 256;

template <class T, bool I8>
void amx_panel_rows(const GemmArgs& g, int64_t p, int64_t mb, int64_t me, int64_t kmain) {
  const int64_t nvp = (std::min<int64_t>(kGemmPanel, g.N - p * kGemmPanel) + 15) / 16;
  const bool wide = nvp == 4 && g.K <= kWideMaxK && requant64_applies(g, p * kGemmPanel);
  Requant64 t64;
  if (wide) t64 = Requant64(g, p * kGemmPanel, g.a_zp - (I8 ? 128 : 0));
  int64_t m = mb;
  for (; me - m >= kTileRows;) {
    const bool two_rows = me - m >= kBlockRows;
    if (wide) {
      if (two_rows) amx_block4<T, 2, I8>(g, m, p, kmain, t64);
      else amx_block4<T, 1, I8>(g, m, p, kmain, t64);
      m += two_rows ? kBlockRows : kTileRows;
      continue;
    }
    for (int64_t v = 0; v < nvp; v += 2) {
      const bool two_cols = nvp - v >= 2;
      if (two_rows && two_cols) amx_block<T, 2, 2, I8>(g, m, p, v, nvp, kmain);
      else if (two_rows) amx_block<T, 2, 1, I8>(g, m, p, v, nvp, kmain);
      else if (two_cols) amx_block<T, 1, 2, I8>(g, m, p, v, nvp, kmain);
      else amx_block<T, 1, 1, I8>(g, m, p, v, nvp, kmain);
    }
    m += two_rows ? kBlockRows : kTileRows;
  }
  if (m < me) vnni_panel_rows(g, p, m, me);
}

// With integer output, a weight of at most kRowMajorWeight bytes (L1) runs row-major: kRowMajorRows rows over every
// panel before the next rows, so that the output rows (and a residual's) are written (read) whole,
// line after line, instead of a panel's share of each row per pass.
constexpr int64_t kRowMajorWeight = int64_t(32) << 10;
constexpr int64_t kRowMajorRows = 4 * kBlockRows;

template <class T>
void gemm_amx(const GemmArgs& g, int64_t m_begin, int64_t m_end, int64_t panel_begin, int64_t panel_end) {
  const int64_t kmain = g.K / kTileBytes * kTileBytes;
  if (kmain == 0 || m_end - m_begin < kTileRows) {  // nothing fills a tile: the VNNI kernel
    sweep(g, m_begin, m_end, panel_begin, panel_end, kMaxRows,
          [&](int64_t p, int64_t mb, int64_t me, NextPanel next) { vnni_panel_rows(g, p, mb, me, next); });
    return;
  }
  T::configure(tile_config());
  struct Release {
    ~Release() { T::release(); }  // also when the emulation raises
  } release;
  auto panel_rows = [&](int64_t p, int64_t mb, int64_t me) {
    if (g.a_int8) amx_panel_rows<T, true>(g, p, mb, me, kmain);
    else amx_panel_rows<T, false>(g, p, mb, me, kmain);
  };
  if ((g.out_type == GemmOut::u8 || g.out_type == GemmOut::s8) &&
      (panel_end - panel_begin) * kGemmPanel * gemm_kp(g.K) <= kRowMajorWeight) {
    for (int64_t mb = m_begin; mb < m_end; mb += kRowMajorRows)
      for (int64_t p = panel_begin; p < panel_end; ++p) panel_rows(p, mb, std::min(m_end, mb + kRowMajorRows));
    return;
  }
  sweep(g, m_begin, m_end, panel_begin, panel_end, kBlockRows, panel_rows);
}

// The AMX peak: 4 independent tdpbusd chains (C tiles 0-3 from A tiles 4, 5 and B tiles 6, 7),
// 16 dot products per iteration, each 16 x 16 x 64 multiply-adds.
double amx_peak_loop(int64_t iters) {
  alignas(64) static const uint8_t zeros[kTileRows * kTileBytes] = {};
  HwTiles::configure(tile_config());
  HwTiles::load<4>(zeros, kTileBytes);
  HwTiles::load<5>(zeros, kTileBytes);
  HwTiles::load<6>(zeros, kTileBytes);
  HwTiles::load<7>(zeros, kTileBytes);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        ".rept 4\n\t"
        "tdpbusd %%tmm6, %%tmm4, %%tmm0\n\t tdpbusd %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbusd %%tmm6, %%tmm5, %%tmm2\n\t tdpbusd %%tmm7, %%tmm5, %%tmm3\n\t"
        ".endr\n\t" ::: "memory");
  }
  HwTiles::release();
  return static_cast<double>(iters) * 16 * (kTileRows * kTileRows * kTileBytes) * 2;
}

// The emulator's own speed on the same loop (no meaning as a CPU's peak; for completeness).
double emulated_peak_loop(int64_t iters) {
  EmuTiles::configure(tile_config());
  for (int64_t i = 0; i < iters; ++i) EmuTiles::dot<0, 4, 6, false>();
  EmuTiles::release();
  return static_cast<double>(iters) * (kTileRows * kTileRows * kTileBytes) * 2;
}

// Deterministic bytes for the self-check.
struct Lcg {
  uint64_t s;
  uint8_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(s >> 56);
  }
};

// Runs `kernel` and the VNNI kernel on problems that cover every block shape and remainder (rows
// 16, 32, 45; K 64, 200; 1-4 vectors per panel; uint8 and int8 activations, the extremes included)
// with fp32 output and unit scales, so that the outputs are the exact integer sums, and compares
// both with int64 sums. Returns "" when all agree, else what differed.
std::string self_check(GemmFn kernel) {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{32, 64, 64}, {45, 200, 200}, {16, 16, 128}, {50, 97, 130}};
  Lcg rng{12345};
  for (const Shape& s : shapes)
    for (int a_int8 = 0; a_int8 < 2; ++a_int8) {
      std::vector<uint8_t> a(static_cast<size_t>(s.M * s.K));
      std::vector<int8_t> w(static_cast<size_t>(s.N * s.K));
      for (auto& x : a) x = rng.next();
      for (auto& x : w) x = static_cast<int8_t>(rng.next());
      a[0] = a_int8 ? 0x80 : 0xff;  // the extremes: -128 / 255 times -128
      w[0] = -128;
      std::vector<int8_t> packed(static_cast<size_t>(gemm_np(s.N) * gemm_kp(s.K)));
      std::vector<int32_t> colsum(static_cast<size_t>(gemm_np(s.N)));
      gemm_pack_b(w.data(), s.N, s.K, packed.data(), colsum.data());
      std::vector<float> ones(static_cast<size_t>(s.N), 1.0f), out_amx(static_cast<size_t>(s.M * s.N)),
          out_vnni(out_amx.size());
      GemmArgs g;
      g.M = s.M;
      g.N = s.N;
      g.K = s.K;
      g.a = a.data();
      g.lda = s.K;
      g.a_int8 = a_int8;
      g.a_zp = a_int8 ? 128 : 0;  // the uint8 view of int8 bytes with zero point 0
      g.b = packed.data();
      g.colsum = colsum.data();
      g.w_scales = ones.data();
      g.out_type = GemmOut::f32;
      g.ldc = s.N;
      g.out = out_amx.data();
      kernel(g, 0, s.M, 0, gemm_num_panels(s.N));
      g.out = out_vnni.data();
      sweep(g, 0, s.M, 0, gemm_num_panels(s.N), kMaxRows,
            [&](int64_t p, int64_t mb, int64_t me) { vnni_panel_rows(g, p, mb, me); });
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          int64_t ref = 0;
          for (int64_t k = 0; k < s.K; ++k) {
            const uint8_t byte = a[m * s.K + k];
            ref += (a_int8 ? int64_t(int8_t(byte)) : int64_t(byte)) * w[n * s.K + k];
          }
          const float got = out_amx[m * s.N + n], vnni = out_vnni[m * s.N + n];
          if (got != static_cast<float>(ref) || vnni != static_cast<float>(ref))
            return "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                   (a_int8 ? " int8" : " uint8") + " activations, row " + std::to_string(m) + " column " +
                   std::to_string(n) + ": AMX " + std::to_string(got) + ", VNNI " + std::to_string(vnni) +
                   ", exact " + std::to_string(ref);
        }
    }
  return "";
}

}  // namespace

const GemmKernels& gemm_kernels_amx() {
  static const GemmKernels k{"amx", &gemm_amx<HwTiles>, kBlockRows, &amx_peak_loop, direct_conv_amx()};
  return k;
}

const GemmKernels& gemm_kernels_amx_emulated() {
  static const GemmKernels k{"amx_emulated", &gemm_amx<EmuTiles>, kBlockRows, &emulated_peak_loop,
                             direct_conv_amx_emulated()};
  return k;
}

std::string gemm_amx_self_check(bool emulated) {
  // The probe asks Linux for the tile-data permission: without it the first tile instruction faults.
  if (!emulated && !cpu::has(cpu::Isa::Amx)) return "AMX is not usable on this CPU (or under QBACKEND_ISA)";
  if (emulated && !cpu::has(cpu::Isa::Avx512Vnni)) return "the emulated AMX kernel needs AVX512-VNNI";
  return self_check(emulated ? &gemm_amx<EmuTiles> : &gemm_amx<HwTiles>);
}

}  // namespace qbackend::kernels
