// The row and channel loops of the weight-only int8 kernels (woq_kernels.h), shared by the ISA units:
// each defines, in its anonymous namespace, `template <int MR> void pass(x, ldx, tile, K, out[MR][4])`
// (the sums of MR rows of x against the four weight rows of a row tile) and then includes this header
// there, after its QB_TARGET, so the loops compile for its ISA.
#pragma once

#include "kernels/row_passes_impl.h"

void gemv_s8(const float* x, int64_t ldx, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
             const float* scale, const float* bias, float* y, int64_t ldy) {
  const int64_t tile_bytes = WeightTiles::tile_bytes(K);
  row_passes(M, [&]<int MR>(int64_t m) {
    each_tile<MR>(n0, n1, scale, bias, y + m * ldy, ldy, [&](int64_t n, float out[MR][4]) {
      pass<MR>(x + m * ldx, ldx, w + n / 4 * tile_bytes, K, out);
    });
  });
}

// The int4 loops: each unit's `pass4<MR>(x, ldx, tile, st, ot, K, G, out[MR][4])` returns the sums of MR
// rows of x against the four dequantized 4-bit weight rows of a row tile, st and ot its float16 group
// tiles of scales and offsets (st[4 g + j]: row j's scale of group g).
void gemv_u4(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
             const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ng = (K + G - 1) / G, tile_bytes = WeightTiles::tile_bytes((K + 1) / 2);
  row_passes(M, [&]<int MR>(int64_t m) {
    each_tile<MR>(n0, n1, nullptr, bias, y + m * ldy, ldy, [&](int64_t n, float out[MR][4]) {
      const int64_t gt = WeightTiles::group_tile(n, ng);
      pass4<MR>(x + m * ldx, ldx, w + n / 4 * tile_bytes, scale + gt, offset + gt, K, G, out);
    });
  });
}
