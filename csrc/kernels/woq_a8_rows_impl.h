// The row and channel loops of the W4A8 and W8A8 kernels (woq_a8_kernels.h), shared by the SIMD units:
// each defines, in its anonymous namespace, `template <int MR> void pass_a8(q, m0, tile, st, ot, K, G, out[MR][4])`
// (the scaled sums of rows m0 .. m0 + MR - 1 of q against the four 4-bit weight rows of a row tile, st
// its float16 group tile of scales: st[4 g + j] row j's scale of group g; ot its group tile of offsets, whose
// terms, each group's offsets times the row's group sum, the pass adds) and
// `template <int MR> void pass_s8a8(q, m0, tile, K, out[MR][4])` (against the four int8 weight rows of a
// row tile, the channel scales left out) and `constexpr int kS8A8Tiles` (1, or the tiles of a
// pass_s8a8_tiles, see gemv_s8a8), then includes this header there, after its QB_TARGET, so the loops
// compile for its ISA.
#pragma once

#include "kernels/row_passes_impl.h"

void gemv_u4a8(const BlockQuantizedRows& q, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
               const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t tile_bytes = WeightTiles::tile_bytes((K + 1) / 2);
  row_passes(M, [&]<int MR>(int64_t m) {
    each_tile<MR>(n0, n1, nullptr, bias, y + m * ldy, ldy, [&](int64_t n, float out[MR][4]) {
      const int64_t gt = WeightTiles::group_tile(n, q.ng);
      pass_a8<MR>(q, m, w + n / 4 * tile_bytes, scale + gt, offset + gt, K, G, out);
    });
  });
}

// W8A8: where the unit sets kS8A8Tiles > 1 (and defines pass_s8a8_tiles<MR, NT>, the sums of NT row tiles
// in one pass, each row's and channel's sum in the order pass_s8a8 takes), a pass of four rows takes
// kS8A8Tiles tiles at a time, so each row block of x is read once for all of them; the channels left over go
// a tile at a time. That is where x has more than one pass of rows, so a block of channels is read from
// memory once and from the cache by the later passes. With one pass (decoding) every pass goes a tile at
// a time: it is bound by the weights' bandwidth, which a tile at a time reads as one sequential stream (NT
// tiles at once are NT streams: SmolLM2's int8 output projection took 2x as long at one row, 1.4x at four).
// Every output is the same float either way.
void gemv_s8a8(const BlockQuantizedRows8& q, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  const int64_t tile_bytes = WeightTiles::tile_bytes(K);
  const bool cached = M > kRowsPerPass;
  row_passes(M, [&]<int MR>(int64_t m) {
    int64_t n = n0;
    if constexpr (kS8A8Tiles > 1 && MR == kRowsPerPass) {
      for (; cached && n + 4 * kS8A8Tiles <= n1; n += 4 * kS8A8Tiles) {
        float out[kS8A8Tiles][MR][4];
        pass_s8a8_tiles<MR, kS8A8Tiles>(q, m, w + n / 4 * tile_bytes, tile_bytes, K, out);
        for (int t = 0; t < kS8A8Tiles; ++t) store_tile<MR>(n + 4 * t, n1, scale, bias, y + m * ldy, ldy, out[t]);
      }
    }
    each_tile<MR>(n, n1, scale, bias, y + m * ldy, ldy, [&](int64_t nn, float out[MR][4]) {
      pass_s8a8<MR>(q, m, w + nn / 4 * tile_bytes, K, out);
    });
  });
}
