// The row and channel loops of the weight-only int8 kernels (woq_kernels.h), shared by the ISA units:
// each defines, in its anonymous namespace, `template <int MR> void pass(x, ldx, tile, K, out[MR][4])`
// (the sums of MR rows of x against the four weight rows of a row tile) and then includes this header
// there, after its QB_TARGET, so the loops compile for its ISA (the unit includes <vector> and
// kernels/f16_lanes.h first).
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
// rows of x against the four dequantized 4-bit weight rows of a row tile, st and ot its group tiles of
// scales and offsets as float32 (st[4 g + j]: row j's scale of group g), converted from the float16 tiles
// (f16_lanes.h) before each pass: the passes broadcast each value from memory, and converting inside
// them would interleave stores with their accumulators (GCC then kept those on the stack: 1.3-1.8x
// slower on AVX2).
void gemv_u4(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
             const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ng = (K + G - 1) / G, tile_bytes = WeightTiles::tile_bytes((K + 1) / 2);
  std::vector<float> values(size_t(8 * ng));  // a row tile's scales, then its offsets
  float* const st = values.data();
  float* const ot = st + 4 * ng;
  row_passes(M, [&]<int MR>(int64_t m) {
    each_tile<MR>(n0, n1, nullptr, bias, y + m * ldy, ldy, [&](int64_t n, float out[MR][4]) {
      const int64_t gt = WeightTiles::group_tile(n, ng);
      f16_to_float_n(scale + gt, 4 * ng, st);
      f16_to_float_n(offset + gt, 4 * ng, ot);
      pass4<MR>(x + m * ldx, ldx, w + n / 4 * tile_bytes, st, ot, K, G, out);
    });
  });
}
