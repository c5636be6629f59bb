// The rows of x in passes of up to kRowsPerPass (woq_kernels.h), the weight-only kernels' register
// tile: row_passes(M, pass) calls pass.template operator()<MR>(m) for each pass, m its first row and
// MR its rows. Included by the kernels' loop headers (woq_rows_impl.h, woq_a8_rows_impl.h) inside
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
