// The row and channel loops of the W4A8 and W8A8 kernels (woq_a8_kernels.h), shared by the SIMD units:
// each defines, in its anonymous namespace, `template <int MR> void pass_a8(q, m0, wr[4], sc[4], K, G, out[MR][4])`
// (the scaled sums of rows m0 .. m0 + MR - 1 of q against four 4-bit weight rows, offsets left out) and
// `template <int MR> void pass_s8a8(q, m0, wr[4], K, out[MR][4])` (against four int8 weight rows, the
// channel scales left out), then includes this header there, after its QB_TARGET, so the loops
// compile for its ISA.
#pragma once

#include "kernels/row_passes_impl.h"

template <int MR>
void rows_a8(const BlockQuantizedRows& q, int64_t m0, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
             const float* scale, const float* offset, const float* bias, float* y, int64_t ldy) {
  const int64_t ldw = (K + 1) / 2, ng = q.ng;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    const uint8_t* wr[4];
    const float* sc[4];
    // a short tail of channels repeats its last row (its sums are not stored)
    for (int j = 0; j < 4; ++j) {
      const int64_t row = n + std::min<int64_t>(j, nr - 1);
      wr[j] = w + row * ldw;
      sc[j] = scale + row * ng;
    }
    float out[MR][4];
    pass_a8<MR>(q, m0, wr, sc, K, G, out);
    for (int i = 0; i < MR; ++i) {
      const float* gs = q.group_sum + (m0 + i) * ng;
      for (int64_t j = 0; j < nr; ++j) {
        const float* of = offset + (n + j) * ng;
        float o = out[i][j];
        for (int64_t g = 0; g < ng; ++g) o += of[g] * gs[g];
        y[(m0 + i) * ldy + n + j] = o + (bias ? bias[n + j] : 0.0f);
      }
    }
  }
}

void gemv_u4a8(const BlockQuantizedRows& q, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0, int64_t n1,
               const float* scale, const float* offset, const float* bias, float* y, int64_t ldy) {
  row_passes(M, [&]<int MR>(int64_t m) { rows_a8<MR>(q, m, w, K, G, n0, n1, scale, offset, bias, y, ldy); });
}

template <int MR>
void rows_s8a8(const BlockQuantizedRows8& q, int64_t m0, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    const int8_t* wr[4];
    for (int j = 0; j < 4; ++j) wr[j] = w + (n + std::min<int64_t>(j, nr - 1)) * K;
    float out[MR][4];
    pass_s8a8<MR>(q, m0, wr, K, out);
    for (int i = 0; i < MR; ++i)
      for (int64_t j = 0; j < nr; ++j)
        y[(m0 + i) * ldy + n + j] = out[i][j] * scale[n + j] + (bias ? bias[n + j] : 0.0f);
  }
}

void gemv_s8a8(const BlockQuantizedRows8& q, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
               const float* scale, const float* bias, float* y, int64_t ldy) {
  row_passes(M, [&]<int MR>(int64_t m) { rows_s8a8<MR>(q, m, w, K, n0, n1, scale, bias, y, ldy); });
}
