// AMX-INT8 tile plumbing shared by the AMX kernels (gemm_amx.cpp, conv_amx.cpp): the tile
// configuration (every tile 16 rows x 64 bytes), the instructions (HwTiles) and a C++ model of them
// (EmuTiles) behind the same static interface, so that each kernel template compiles for both and
// the emulated kernel runs the hardware kernel's blocking on CPUs without AMX. Tile roles: C tiles
// 0-3 (C[i][j] = 2 i + j), A tiles 4-5, B tiles 6-7. Included after the unit's QB_TARGET(QB_ISA_AMX);
// everything sits in an anonymous namespace (one copy per unit).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace qbackend::kernels {
namespace {

constexpr int kTileRows = 16;   // rows of every tile
constexpr int kTileBytes = 64;  // bytes per tile row: 64 k's of A; 16 int32 columns of B and C
constexpr int64_t kBlockRows = 2 * kTileRows;

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

const TileConfig& tile_config() {
  static const TileConfig c = [] {
    TileConfig t;
    for (int i = 0; i < 8; ++i) {
      t.colsb[i] = kTileBytes;
      t.rows[i] = kTileRows;
    }
    return t;
  }();
  return c;
}

// ---- The instructions. Tile numbers are part of the instruction, hence the constant cases.
struct HwTiles {
  static void configure(const TileConfig& c) { __asm__ volatile("ldtilecfg (%0)" ::"r"(&c) : "memory"); }
  static void release() { _tile_release(); }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < 4);
    if constexpr (T == 0) _tile_zero(0);
    if constexpr (T == 1) _tile_zero(1);
    if constexpr (T == 2) _tile_zero(2);
    if constexpr (T == 3) _tile_zero(3);
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8);
    if constexpr (T == 0) _tile_loadd(0, p, stride);
    if constexpr (T == 1) _tile_loadd(1, p, stride);
    if constexpr (T == 2) _tile_loadd(2, p, stride);
    if constexpr (T == 3) _tile_loadd(3, p, stride);
    if constexpr (T == 4) _tile_loadd(4, p, stride);
    if constexpr (T == 5) _tile_loadd(5, p, stride);
    if constexpr (T == 6) _tile_loadd(6, p, stride);
    if constexpr (T == 7) _tile_loadd(7, p, stride);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    static_assert(T >= 0 && T < 4);
    if constexpr (T == 0) _tile_stored(0, p, stride);
    if constexpr (T == 1) _tile_stored(1, p, stride);
    if constexpr (T == 2) _tile_stored(2, p, stride);
    if constexpr (T == 3) _tile_stored(3, p, stride);
  }
  // C += A . B: tdpbusd (u8 A) or tdpbssd (s8 A), B s8.
  template <int C, int A, int B, bool S8>
  static void dot() {
    static_assert(C == 2 * (A - 4) + (B - 6), "C[i][j] = 2 i + j with A = 4 + i, B = 6 + j");
#define QB_DOT(c, a, b)                                \
  if constexpr (C == c && A == a && B == b) {          \
    if constexpr (S8) _tile_dpbssd(c, a, b);           \
    else _tile_dpbusd(c, a, b);                        \
  }
    QB_DOT(0, 4, 6) QB_DOT(1, 4, 7) QB_DOT(2, 5, 6) QB_DOT(3, 5, 7)
#undef QB_DOT
  }
};

// ---- A C++ model of the same instructions (Intel SDM, "TILELOADD", "TDPBUSD/TDPBSSD"...), per
// thread like the tile registers. It raises where the hardware would fault: a tile op before
// ldtilecfg on this thread, a palette other than 1, rows > 16 or colsb > 64, and dot-product
// operands whose configured shapes do not match.
struct EmuTiles {
  struct State {
    bool configured = false;
    uint8_t rows[8] = {};
    uint16_t colsb[8] = {};
    uint8_t t[8][kTileRows][kTileBytes] = {};
  };
  static State& st() {
    static thread_local State s;
    return s;
  }
  static State& ready() {
    State& s = st();
    if (!s.configured) throw std::logic_error("AMX emulation: a tile instruction before ldtilecfg on this thread");
    return s;
  }
  static void configure(const TileConfig& c) {
    State& s = st();
    if (c.palette != 1) throw std::logic_error("AMX emulation: palette must be 1");
    for (int i = 0; i < 8; ++i) {
      if (c.rows[i] > kTileRows || c.colsb[i] > kTileBytes)
        throw std::logic_error("AMX emulation: a tile larger than 16 rows x 64 bytes");
      s.rows[i] = c.rows[i];
      s.colsb[i] = c.colsb[i];
    }
    std::memset(s.t, 0, sizeof(s.t));  // ldtilecfg zeroes every tile
    s.configured = true;
  }
  static void release() { st().configured = false; }
  template <int T>
  static void zero() {
    std::memset(ready().t[T], 0, sizeof(State::t[T]));
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    State& s = ready();
    std::memset(s.t[T], 0, sizeof(s.t[T]));  // the bytes beyond rows / colsb are zeroed
    for (int r = 0; r < s.rows[T]; ++r) std::memcpy(s.t[T][r], static_cast<const uint8_t*>(p) + r * stride, s.colsb[T]);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    State& s = ready();
    for (int r = 0; r < s.rows[T]; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.t[T][r], s.colsb[T]);
  }
  template <int C, int A, int B, bool S8>
  static void dot() {
    State& s = ready();
    if (s.rows[A] != s.rows[C] || s.colsb[A] != 4 * s.rows[B] || s.colsb[B] != s.colsb[C] || s.colsb[C] % 4 ||
        s.colsb[A] % 4)
      throw std::logic_error("AMX emulation: the dot product's tile shapes do not match");
    for (int m = 0; m < s.rows[C]; ++m)
      for (int n = 0; n < s.colsb[C] / 4; ++n) {
        int32_t c;
        std::memcpy(&c, &s.t[C][m][4 * n], 4);
        uint32_t acc = static_cast<uint32_t>(c);  // the instruction's int32 sums wrap
        for (int k = 0; k < s.colsb[A] / 4; ++k)
          for (int j = 0; j < 4; ++j) {
            const int32_t a = S8 ? int32_t(int8_t(s.t[A][m][4 * k + j])) : int32_t(s.t[A][m][4 * k + j]);
            acc += static_cast<uint32_t>(a * int32_t(int8_t(s.t[B][k][4 * n + j])));
          }
        c = static_cast<int32_t>(acc);
        std::memcpy(&s.t[C][m][4 * n], &c, 4);
      }
  }
};

// The C tiles of a block of RT x 16 rows and CT x 16 columns (C[i][j] = 2 i + j), zeroed.
template <class T, int RT, int CT>
inline void zero_block() {
  T::template zero<0>();
  if constexpr (CT > 1) T::template zero<1>();
  if constexpr (RT > 1) T::template zero<2>();
  if constexpr (RT > 1 && CT > 1) T::template zero<3>();
}

// The C tiles of a block, every row of C[i][j] set to the 16 int32 at row + 16 j (loads with
// stride 0).
template <class T, int RT, int CT>
inline void init_block(const int32_t* row) {
  T::template load<0>(row, 0);
  if constexpr (CT > 1) T::template load<1>(row + 16, 0);
  if constexpr (RT > 1) T::template load<2>(row, 0);
  if constexpr (RT > 1 && CT > 1) T::template load<3>(row + 16, 0);
}

// One 64-k step of the block: A tiles of its 16-row halves from a and a + a1 (rows lda bytes
// apart), B tiles of its 16-column halves from bk and bk + 64 (k-groups ldb bytes apart).
template <class T, int RT, int CT, bool I8>
inline void block_step(const uint8_t* a, int64_t a1, int64_t lda, const int8_t* bk, int64_t ldb) {
  T::template load<4>(a, lda);
  T::template load<6>(bk, ldb);
  T::template dot<0, 4, 6, I8>();
  if constexpr (CT > 1) {
    T::template load<7>(bk + 64, ldb);
    T::template dot<1, 4, 7, I8>();
  }
  if constexpr (RT > 1) {
    T::template load<5>(a + a1, lda);
    T::template dot<2, 5, 6, I8>();
    if constexpr (CT > 1) T::template dot<3, 5, 7, I8>();
  }
}

// The block's sums into `sums`, row-major: row r's CT vectors at sums[r * CT ..] (or, with ld,
// rows ld bytes apart).
template <class T, int RT, int CT>
inline void store_block(void* sums, int64_t ld = CT * 64) {
  uint8_t* s = static_cast<uint8_t*>(sums);
  T::template store<0>(s, ld);
  if constexpr (CT > 1) T::template store<1>(s + 64, ld);
  if constexpr (RT > 1) T::template store<2>(s + kTileRows * ld, ld);
  if constexpr (RT > 1 && CT > 1) T::template store<3>(s + kTileRows * ld + 64, ld);
}

}  // namespace
}  // namespace qbackend::kernels
