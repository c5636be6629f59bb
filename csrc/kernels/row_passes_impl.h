// The rows of x in passes of up to kRowsPerPass (woq_kernels.h), the weight-only kernels' register
// tile: row_passes(M, pass) calls pass.template operator()<MR>(m) for each pass, m its first row and
// MR its rows; each_tile walks a pass over the output channels' row tiles and stores the sums. Included by the kernels' loop headers (woq_rows_impl.h, woq_a8_rows_impl.h) inside
// their unit's anonymous namespace, after its QB_TARGET, so it compiles for the unit's ISA.
#pragma once

template <typename Pass>
void row_passes(int64_t M, const Pass& pass) {
  static_assert(kRowsPerPass == 4, "the passes below are written for up to four rows");
  for (int64_t m = 0; m < M; m += kRowsPerPass) {
    switch (std::min<int64_t>(kRowsPerPass, M - m)) {
      case 1: pass.template operator()<1>(m); break;
      case 2: pass.template operator()<2>(m); break;
      case 3: pass.template operator()<3>(m); break;
      default: pass.template operator()<4>(m); break;
    }
  }
}

// The output channels [n0, n1) a row tile at a time (n0 a multiple of 4): tile(n, out) fills out[MR][4]
// with the sums of a pass's MR rows of x against the four rows of the tile whose first channel is n;
// they are stored (store_tile) as y[i * ldy + n + j] = out[i][j] (times scale[n + j] where scale is given)
// + bias[n + j] for the channels below n1 only (the rows a tile pads are computed and dropped).
template <int MR>
void store_tile(int64_t n, int64_t n1, const float* scale, const float* bias, float* y, int64_t ldy,
                const float out[MR][4]) {
  const int64_t nr = std::min<int64_t>(4, n1 - n);
  for (int i = 0; i < MR; ++i)
    for (int64_t j = 0; j < nr; ++j)
      y[i * ldy + n + j] = (scale ? out[i][j] * scale[n + j] : out[i][j]) + (bias ? bias[n + j] : 0.0f);
}

template <int MR, typename Tile>
void each_tile(int64_t n0, int64_t n1, const float* scale, const float* bias, float* y, int64_t ldy,
               const Tile& tile) {
  for (int64_t n = n0; n < n1; n += 4) {
    float out[MR][4];
    tile(n, out);
    store_tile<MR>(n, n1, scale, bias, y, ldy, out);
  }
}
