// AVX512 (F/BW/VL/DQ) observer kernels: 16 lanes, masked loads for the tail. The histogram bin of
// each lane is computed exactly (float32 where that is exact, else float64; see
// observer_kernels.h) and the counters are bumped by scalar code spread over kHistCopies rows per
// bin. Only this file is compiled for AVX512 (pragma below, after the includes); call it only
// when qbackend::cpu::has(qbackend::cpu::Isa::Avx512).

// GCC 12 warns falsely about the `__Y = __Y` inside _mm512_undefined_* (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

#include "kernels/observer_kernels.h"
#include "cpu/targets.h"

QB_TARGET(QB_ISA_AVX512 QB_ISA_POPCNT)

namespace qbackend::kernels {
namespace {

constexpr int64_t W = 16;
constexpr float kFltMax = 3.40282346638528859812e+38f;
constexpr float kInf = __builtin_inff();

inline __mmask16 tail_mask(int64_t n) { return n >= W ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

inline __m512 load_x(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_x(const uint16_t* p, __mmask16 m) {  // bf16 bits -> fp32 (exact)
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// Lanes of m holding a finite value (|v| <= FLT_MAX is false for NaN and +-inf).
inline __mmask16 finite_mask(__m512 v, __mmask16 m) {
  return _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(v), _mm512_set1_ps(kFltMax), _CMP_LE_OQ);
}

inline void fold(FiniteStats* s, __m512 vmin, __m512 vmax) {
  const float lo = _mm512_reduce_min_ps(vmin), hi = _mm512_reduce_max_ps(vmax);
  s->min = lo < s->min ? lo : s->min;
  s->max = hi > s->max ? hi : s->max;
}

template <typename In>
void stats(const In* x, int64_t n, FiniteStats* s) {
  constexpr int U = 4;  // independent accumulators
  __m512 mn[U], mx[U];
  for (int u = 0; u < U; ++u) {
    mn[u] = _mm512_set1_ps(kInf);
    mx[u] = _mm512_set1_ps(-kInf);
  }
  int64_t finite = 0, i = 0;
  for (; i + U * W <= n; i += U * W) {
    for (int u = 0; u < U; ++u) {
      const __m512 v = load_x(x + i + u * W, 0xFFFF);
      const __mmask16 f = finite_mask(v, 0xFFFF);
      mn[u] = _mm512_mask_min_ps(mn[u], f, mn[u], v);
      mx[u] = _mm512_mask_max_ps(mx[u], f, mx[u], v);
      finite += __builtin_popcount(f);
    }
  }
  for (; i < n; i += W) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = load_x(x + i, m);
    const __mmask16 f = finite_mask(v, m);
    mn[0] = _mm512_mask_min_ps(mn[0], f, mn[0], v);
    mx[0] = _mm512_mask_max_ps(mx[0], f, mx[0], v);
    finite += __builtin_popcount(f);
  }
  for (int u = 1; u < U; ++u) {
    mn[0] = _mm512_min_ps(mn[0], mn[u]);
    mx[0] = _mm512_max_ps(mx[0], mx[u]);
  }
  fold(s, mn[0], mx[0]);
  s->nonfinite += n - finite;
}

// floor(v * inv) - off for 8 float32 lanes widened to float64, truncated to int32 (exact for the
// in-window lanes; INT_MIN for NaN and for values beyond int32, which the unsigned check rejects).
inline __m256i bin8(__m256 v, __m512d inv, __m512d off) {
  const __m512d t = _mm512_roundscale_pd(_mm512_mul_pd(_mm512_cvtps_pd(v), inv), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  return _mm512_cvttpd_epi32(_mm512_sub_pd(t, off));
}

// The general path: float64 (any k, any offset up to 2^52).
struct BinsF64 {
  __m512d inv, off;
  explicit BinsF64(const HistWindow& w) : inv(_mm512_set1_pd(w.inv_width)), off(_mm512_set1_pd(w.offset)) {}
  __m512i operator()(__m512 v) const {
    const __m256 vlo = _mm512_castps512_ps256(v), vhi = _mm512_extractf32x8_ps(v, 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(bin8(vlo, inv, off)), bin8(vhi, inv, off), 1);
  }
};

// The fast path, when 2^-k is a normal float32 and |offset| + bins <= 2^30: v * 2^-k is exact in
// float32 unless it overflows (then it is far outside the window: cvtt gives INT_MIN) or
// underflows, which needs 2^-k < 1 (kUnderflow): its floor is then 0, or -1 for negative v, which
// the min with -1 restores when the product rounded to -0. The int32 difference with offset can
// wrap only for lanes far outside, which stay outside [0, bins) as unsigned.
template <bool kUnderflow>
struct BinsF32 {
  __m512 inv;
  __m512i off, minus_one;
  explicit BinsF32(const HistWindow& w)
      : inv(_mm512_set1_ps(float(w.inv_width))), off(_mm512_set1_epi32(int32_t(w.offset))),
        minus_one(_mm512_set1_epi32(-1)) {}
  __m512i operator()(__m512 v) const {
    const __m512 t = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512i b = _mm512_cvttps_epi32(t);
    if (kUnderflow) {
      const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
      b = _mm512_mask_min_epi32(b, neg, b, minus_one);
    }
    return _mm512_sub_epi32(b, off);
  }
};

inline bool f32_usable(const HistWindow& w) {
  return w.inv_width >= 0x1p-126 && w.inv_width <= 0x1p127 &&
         (w.offset < 0 ? -w.offset : w.offset) + double(w.bins) <= 0x1p30;
}

struct Acc {  // per-call running state of hist()
  __m512 vmin, vmax;
  int64_t zeros;
};

// Entries of the 16 values at p (the lanes of m when kTail) appended to idx[*cnt..]: for bin i
// (the window bin if finite and in the window, else B (non-finite) or B + 1) the entry is
// i * 8 + lane % 8, so each row of a bin gets at most 2 of every 16 values. With kZeros the exact
// zeros are left out and counted instead (compress first, then the rows).
template <bool kTail, bool kZeros, typename In, typename Bins>
inline void step(const In* p, __mmask16 m, const Bins& bins_of, __m512i nb, int32_t* idx, int64_t* cnt, Acc* a) {
  const __m512 v = kTail ? load_x(p, m) : load_x(p, __mmask16(0xFFFF));
  const __mmask16 f = finite_mask(v, m);
  a->vmin = _mm512_mask_min_ps(a->vmin, f, a->vmin, v);
  a->vmax = _mm512_mask_max_ps(a->vmax, f, a->vmax, v);
  __m512i b = bins_of(v);
  const __mmask16 in = _mm512_mask_cmplt_epu32_mask(f, b, nb);  // finite and 0 <= bin < B
  b = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(nb, f, _mm512_add_epi32(nb, _mm512_set1_epi32(1))), in, b);
  const __m512i row = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  int32_t* dst = idx + *cnt;
  if (kZeros) {
    const __mmask16 zero = _mm512_mask_cmp_ps_mask(m, v, _mm512_setzero_ps(), _CMP_EQ_OQ);
    const __mmask16 keep = m & ~zero;
    if (keep != 0xFFFF) {
      a->zeros += __builtin_popcount(zero);
      b = _mm512_maskz_compress_epi32(keep, b);
    }
    _mm512_storeu_si512(dst, _mm512_or_si512(_mm512_slli_epi32(b, 3), row));
    *cnt += __builtin_popcount(keep);
  } else {  // a tail's mask is its low lanes: the extra lanes are stored but not counted
    _mm512_storeu_si512(dst, _mm512_or_si512(_mm512_slli_epi32(b, 3), row));
    *cnt += kTail ? __builtin_popcount(m) : W;
  }
}

constexpr int64_t kBlk = 256;  // values per block: their entries are listed, then incremented

// One block's entries into idx; after each full vector step, between() (the previous block's
// increments, so that the out-of-order core overlaps the vector and the scalar work).
template <bool kZeros, typename In, typename Bins, typename Between>
inline int64_t block(const In* x, int64_t len, const Bins& bins_of, __m512i nb, int32_t* idx, Acc* a,
                     Between between) {
  constexpr int64_t kAhead = 4 * kBlk;  // software prefetch distance (elements): the scalar work
                                        // leaves the hardware prefetcher too little to go on
  int64_t cnt = 0, j = 0;
  for (; j + W <= len; j += W) {
    _mm_prefetch(reinterpret_cast<const char*>(x + j + kAhead), _MM_HINT_T0);
    step<false, kZeros>(x + j, __mmask16(0xFFFF), bins_of, nb, idx, &cnt, a);
    between();
  }
  if (j < len) step<true, kZeros>(x + j, tail_mask(len - j), bins_of, nb, idx, &cnt, a);
  return cnt;
}

template <typename In, typename Bins>
void hist_impl(const In* x, int64_t n, const HistWindow& w, const Bins& bins_of, uint16_t* counts, FiniteStats* s,
               int64_t* zeros) {
  static_assert(kHistCopies == 8, "entries are bin * 8 + lane % 8");
  const __m512i nb = _mm512_set1_epi32(w.bins);
  Acc a{_mm512_set1_ps(kInf), _mm512_set1_ps(-kInf), 0};
  // Each block's entries go to a list (vector stores); the list of a block is incremented
  // between the vector steps of the next (scalar loads right behind a 512-bit store of their own
  // lanes would wait for the store: no forwarding; and the two kinds of work overlap). Exact zeros
  // (half of the values after a ReLU) are compressed out and counted while a block has many (3/8
  // of its values: the compress puts a popcount on the store addresses' dependency chain, which
  // costs more than the increments it saves below that); every 16th block measures again, so data
  // without zeros does not pay for the check.
  alignas(64) int32_t idx[2][kBlk + W];
  int64_t blk = 0, prev_cnt = 0;  // block number; entries in the previous block's list
  int cur = 0;
  bool zeros_hot = true;
  for (int64_t i = 0; i < n; i += kBlk, ++blk) {
    const int64_t len = n - i < kBlk ? n - i : kBlk;
    const int32_t* prev = idx[cur ^ 1];
    int64_t done = 0;
    auto between = [&] {  // up to 16 of the previous block's increments
      if (done + 16 <= prev_cnt) {
        for (int q = 0; q < 16; ++q) ++counts[prev[done + q]];
        done += 16;
      }
    };
    int64_t cnt;
    if (zeros_hot || (blk & 15) == 0) {
      const int64_t before = a.zeros;
      cnt = block<true>(x + i, len, bins_of, nb, idx[cur], &a, between);
      zeros_hot = (a.zeros - before) * 8 > 3 * len;
    } else {
      cnt = block<false>(x + i, len, bins_of, nb, idx[cur], &a, between);
    }
    for (; done < prev_cnt; ++done) ++counts[prev[done]];
    prev_cnt = cnt;
    cur ^= 1;
  }
  for (int64_t j = 0; j < prev_cnt; ++j) ++counts[idx[cur ^ 1][j]];
  fold(s, a.vmin, a.vmax);
  *zeros += a.zeros;
}

template <typename In>
void hist(const In* x, int64_t n, const HistWindow& w, uint16_t* counts, FiniteStats* s, int64_t* zeros) {
  if (!f32_usable(w)) hist_impl(x, n, w, BinsF64(w), counts, s, zeros);
  else if (w.inv_width < 1.0) hist_impl(x, n, w, BinsF32<true>(w), counts, s, zeros);
  else hist_impl(x, n, w, BinsF32<false>(w), counts, s, zeros);
}

constexpr ObserverKernels kTable{"avx512", stats<float>, stats<uint16_t>, hist<float>, hist<uint16_t>};

}  // namespace

const ObserverKernels& observer_kernels_avx512() { return kTable; }

}  // namespace qbackend::kernels
