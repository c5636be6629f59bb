// The row and channel loops of the W4A8 and W8A8 kernels (woq_a8_kernels.h), shared by the SIMD units:
// each defines, in its anonymous namespace, `template <int MR> void pass_a8(q, m0, tile, sc[4], K, G, out[MR][4])`
// (the scaled sums of rows m0 .. m0 + MR - 1 of q against the four 4-bit weight rows of a row tile,
// offsets left out) and `template <int MR> void pass_s8a8(q, m0, tile, K, out[MR][4])` (against the four
// int8 weight rows of a row tile, the channel scales left out), then includes this header there, after its QB_TARGET, so the loops
// compile for its ISA.
#pragma once

#include "kernels/row_passes_impl.h"

template <int MR>
void rows_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
             const float* scale, const float* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ng = q.ng, tile_bytes = WeightTiles::tile_bytes((K + 1) / 2);
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    const float* sc[4];
    // a tile's padding rows (zero weights, their sums not stored) take the last row's group scales
    for (int j = 0; j < 4; ++j) sc[j] = scale + (n + std::min<int64_t>(j, nr - 1)) * ng;
    float out[MR][4];
    pass_a8<MR>(q, m0, w + n / 4 * tile_bytes, sc, K, G, out);
    // the groups' offsets times the activations' group sums: MR x 4 independent sums, group by group
    const float* of[4];
    for (int j = 0; j < 4; ++j) of[j] = offset + (n + std::min<int64_t>(j, nr - 1)) * ng;
    for (int64_t g = 0; g < ng; ++g)
      for (int i = 0; i < MR; ++i) {
        const float gs = q.group_sum[(m0 + i) * ng + g];
        for (int j = 0; j < 4; ++j) out[i][j] += of[j][g] * gs;
      }
    for (int i = 0; i < MR; ++i)
      for (int64_t j = 0; j < nr; ++j) y[(m0 + i) * ldy + n + j] = out[i][j] + (bias ? bias[n + j] : 0.0f);
  }
}

void gemv_u4a8(const BlockQuantizedRows& q, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
               const float* scale, const float* offset, const float* bias, float* y, int64_t ldy) {
  row_passes(M, [&]<int MR>(int64_t m) { rows_a8<MR>(q, m, w, K, G, n0, n1, scale, offset, bias, y, ldy); });
}

template <int MR>
void rows_s8a8(const BlockQuantizedRows8& q, int64_t m0, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  const int64_t tile_bytes = WeightTiles::tile_bytes(K);
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    float out[MR][4];
    pass_s8a8<MR>(q, m0, w + n / 4 * tile_bytes, K, out);  // a tile's rows beyond n1 are not stored
    for (int i = 0; i < MR; ++i)
      for (int64_t j = 0; j < nr; ++j)
        y[(m0 + i) * ldy + n + j] = out[i][j] * scale[n + j] + (bias ? bias[n + j] : 0.0f);
  }
}

void gemv_s8a8(const BlockQuantizedRows8& q, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  row_passes(M, [&]<int MR>(int64_t m) { rows_s8a8<MR>(q, m, w, K, n0, n1, scale, bias, y, ldy); });
}
