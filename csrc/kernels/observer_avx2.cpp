// AVX2 observer kernels: 8 lanes; tails go through a zero-padded stack block with a lane mask, so
// they use the very same instructions. The histogram bin of each lane is computed in float64
// (exact, see observer_kernels.h). Only this file is compiled for AVX2 (pragma below, after the
// includes); call it only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/observer_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX2 QB_ISA_POPCNT)

#include "kernels/avx2_common.h"  // after the pragma: compiled for this target

namespace qbackend::kernels {
namespace {

constexpr int64_t W = 8;
constexpr float kFltMax = 3.40282346638528859812e+38f;
constexpr float kInf = __builtin_inff();

inline __m256 load_x(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_x(const uint16_t* p) {  // bf16 bits -> fp32 (exact)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// The last n < W values, zero padded, and the mask of the real lanes.
template <typename In>
inline __m256 load_tail(const In* p, int64_t n, __m256* lanes) {
  In buf[W] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(In));
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  *lanes = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(n)), iota));
  return load_x(buf);
}

inline __m256 finite_lanes(__m256 v) {
  const __m256 abs = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  return _mm256_cmp_ps(abs, _mm256_set1_ps(kFltMax), _CMP_LE_OQ);
}

inline void fold(FiniteStats* s, __m256 vmin, __m256 vmax) {
  const float lo = avx2::hmin(vmin), hi = avx2::hmax(vmax);
  s->min = lo < s->min ? lo : s->min;
  s->max = hi > s->max ? hi : s->max;
}

// Folds the lanes of v selected by f (all-ones lanes) into the running min/max.
inline void minmax_step(__m256 v, __m256 f, __m256* vmin, __m256* vmax) {
  *vmin = _mm256_blendv_ps(*vmin, _mm256_min_ps(*vmin, v), f);
  *vmax = _mm256_blendv_ps(*vmax, _mm256_max_ps(*vmax, v), f);
}

template <typename In>
void stats(const In* x, int64_t n, FiniteStats* s) {
  constexpr int U = 4;
  __m256 mn[U], mx[U];
  for (int u = 0; u < U; ++u) {
    mn[u] = _mm256_set1_ps(kInf);
    mx[u] = _mm256_set1_ps(-kInf);
  }
  int64_t finite = 0, i = 0;
  for (; i + U * W <= n; i += U * W) {
    for (int u = 0; u < U; ++u) {
      const __m256 v = load_x(x + i + u * W);
      const __m256 f = finite_lanes(v);
      minmax_step(v, f, &mn[u], &mx[u]);
      finite += __builtin_popcount(unsigned(_mm256_movemask_ps(f)));
    }
  }
  for (; i + W <= n; i += W) {
    const __m256 v = load_x(x + i);
    const __m256 f = finite_lanes(v);
    minmax_step(v, f, &mn[0], &mx[0]);
    finite += __builtin_popcount(unsigned(_mm256_movemask_ps(f)));
  }
  if (i < n) {
    __m256 lanes;
    const __m256 v = load_tail(x + i, n - i, &lanes);
    const __m256 f = _mm256_and_ps(finite_lanes(v), lanes);
    minmax_step(v, f, &mn[0], &mx[0]);
    finite += __builtin_popcount(unsigned(_mm256_movemask_ps(f)));
  }
  for (int u = 1; u < U; ++u) {
    mn[0] = _mm256_min_ps(mn[0], mn[u]);
    mx[0] = _mm256_max_ps(mx[0], mx[u]);
  }
  fold(s, mn[0], mx[0]);
  s->nonfinite += n - finite;
}

// floor(v * inv) - off for 4 float32 lanes widened to float64, truncated to int32 (exact for the
// in-window lanes; INT_MIN for NaN and for values beyond int32, which the range check rejects).
inline __m128i bin4(__m128 v, __m256d inv, __m256d off) {
  const __m256d t = _mm256_floor_pd(_mm256_mul_pd(_mm256_cvtps_pd(v), inv));
  return _mm256_cvttpd_epi32(_mm256_sub_pd(t, off));
}

// The general path: float64 (any k, any offset up to 2^52).
struct BinsF64 {
  __m256d inv, off;
  explicit BinsF64(const HistWindow& w) : inv(_mm256_set1_pd(w.inv_width)), off(_mm256_set1_pd(w.offset)) {}
  __m256i operator()(__m256 v) const {
    return _mm256_set_m128i(bin4(_mm256_extractf128_ps(v, 1), inv, off), bin4(_mm256_castps256_ps128(v), inv, off));
  }
};

// The fast path when 2^-k is a normal float32 and |offset| + bins <= 2^30 (the reasoning is in
// observer_avx512.cpp): float32 product and floor, int32 difference.
struct BinsF32 {
  __m256 inv;
  __m256i off;
  explicit BinsF32(const HistWindow& w) : inv(_mm256_set1_ps(float(w.inv_width))), off(_mm256_set1_epi32(int32_t(w.offset))) {}
  static bool usable(const HistWindow& w) {
    return w.inv_width >= 0x1p-126 && w.inv_width <= 0x1p127 &&
           (w.offset < 0 ? -w.offset : w.offset) + double(w.bins) <= 0x1p30;
  }
  __m256i operator()(__m256 v) const {
    const __m256i b = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_mul_ps(v, inv)));
    const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    const __m256i cap = _mm256_blendv_epi8(_mm256_set1_epi32(0x7fffffff), _mm256_set1_epi32(-1), neg);
    return _mm256_sub_epi32(_mm256_min_epi32(b, cap), off);
  }
};

// Bin of each lane: its window bin if finite (f) and 0 <= bin < B, else B (non-finite) or B + 1.
template <typename Bins>
inline __m256i bins8(__m256 v, __m256 f, const Bins& bins_of, __m256i nb) {
  const __m256i b = bins_of(v);
  const __m256i fi = _mm256_castps_si256(f);
  const __m256i in = _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(nb, b), _mm256_cmpgt_epi32(b, _mm256_set1_epi32(-1))), fi);
  const __m256i other = _mm256_sub_epi32(nb, fi);  // fi is -1 on finite lanes: B + 1, else B
  return _mm256_blendv_epi8(other, b, in);
}

// kCompress.p[m]: the lanes set in the 8-bit mask m, in order (then lane 0 as filler), for
// _mm256_permutevar8x32_epi32 (AVX2 has no compress instruction).
struct CompressTable {
  alignas(32) int32_t p[256][8];
};
constexpr CompressTable make_compress_table() {
  CompressTable t{};
  for (int m = 0; m < 256; ++m) {
    int c = 0;
    for (int b = 0; b < 8; ++b)
      if ((m >> b) & 1) t.p[m][c++] = b;
    while (c < 8) t.p[m][c++] = 0;
  }
  return t;
}
constexpr CompressTable kCompress = make_compress_table();

// Appends the bins of the lanes in `lanes` (an 8-bit mask) that are not exact zeros to idx[cnt..].
template <typename Bins>
inline void append_bins(__m256 v, __m256 f, int lanes, const Bins& bins_of, __m256i nb, int32_t* idx, int64_t* cnt,
                        int64_t* zeros) {
  const __m256i b = bins8(v, f, bins_of, nb);
  const int zero = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)) & lanes;
  const int keep = lanes & ~zero;
  // entry bin * 8 + lane (kHistCopies rows per bin; at most one increment per row per 8 values)
  const __m256i row = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i* dst = reinterpret_cast<__m256i*>(idx + *cnt);
  if (keep == 0xFF) {
    _mm256_storeu_si256(dst, _mm256_or_si256(_mm256_slli_epi32(b, 3), row));
  } else {
    *zeros += __builtin_popcount(unsigned(zero));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.p[keep]));
    _mm256_storeu_si256(dst, _mm256_or_si256(_mm256_slli_epi32(_mm256_permutevar8x32_epi32(b, perm), 3), row));
  }
  *cnt += __builtin_popcount(unsigned(keep));
}

template <typename In, typename Bins>
void hist_impl(const In* x, int64_t n, const HistWindow& w, const Bins& bins_of, uint16_t* counts, FiniteStats* s,
               int64_t* zeros) {
  static_assert(kHistCopies == 8, "one row per lane");
  const __m256i nb = _mm256_set1_epi32(w.bins);
  __m256 vmin = _mm256_set1_ps(kInf), vmax = _mm256_set1_ps(-kInf);
  int64_t z = 0;
  // Bins of a block first (vector stores), then the increments (see observer_avx512.cpp).
  constexpr int64_t kBlk = 256;
  constexpr int64_t kAhead = 4 * kBlk;  // software prefetch distance (elements)
  alignas(32) int32_t idx[kBlk + W];
  for (int64_t i = 0; i < n; i += kBlk) {
    const int64_t len = n - i < kBlk ? n - i : kBlk;
    int64_t cnt = 0, j = 0;
    for (; j + W <= len; j += W) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i + j + kAhead), _MM_HINT_T0);
      const __m256 v = load_x(x + i + j);
      const __m256 f = finite_lanes(v);
      minmax_step(v, f, &vmin, &vmax);
      append_bins(v, f, 0xFF, bins_of, nb, idx, &cnt, &z);
    }
    if (j < len) {
      __m256 lanes;
      const __m256 v = load_tail(x + i + j, len - j, &lanes);
      const __m256 f = _mm256_and_ps(finite_lanes(v), lanes);
      minmax_step(v, f, &vmin, &vmax);
      append_bins(v, f, _mm256_movemask_ps(lanes), bins_of, nb, idx, &cnt, &z);
    }
    for (int64_t k = 0; k < cnt; ++k) ++counts[idx[k]];
  }
  fold(s, vmin, vmax);
  *zeros += z;
}

template <typename In>
void hist(const In* x, int64_t n, const HistWindow& w, uint16_t* counts, FiniteStats* s, int64_t* zeros) {
  if (BinsF32::usable(w)) hist_impl(x, n, w, BinsF32(w), counts, s, zeros);
  else hist_impl(x, n, w, BinsF64(w), counts, s, zeros);
}

constexpr ObserverKernels kTable{"avx2", stats<float>, stats<uint16_t>, hist<float>, hist<uint16_t>};

}  // namespace

const ObserverKernels& observer_kernels_avx2() { return kTable; }

}  // namespace qbackend::kernels
