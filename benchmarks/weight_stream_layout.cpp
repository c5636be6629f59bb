// Weight-streaming layout benchmark (a standalone program, not part of the extension): int8 weights
// [N, K] times a float vector at M = 1, four rows per pass as the weight-only kernels do, read
// row-major (four streams a pass) against the same weights interleaved in 16-byte chunks of the four
// rows in turn (one sequential stream), and a float sum over as many bytes; 60 distinct 1024 x 2816
// weights (173 MB), so every pass reads DRAM. Same arithmetic in both layouts.
//
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mfma -fopenmp benchmarks/weight_stream_layout.cpp -o /tmp/wsl
//   OMP_WAIT_POLICY=active /tmp/wsl
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

#include <omp.h>

void rowmajor(const int8_t* w, const float* x, float* y, int64_t N, int64_t K) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 xv = _mm512_loadu_ps(x + k);
      for (int j = 0; j < 4; ++j) {
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + (n + j) * K + k))));
        acc[j] = _mm512_fmadd_ps(xv, wv, acc[j]);
      }
    }
    for (int j = 0; j < 4; ++j) y[n + j] = _mm512_reduce_add_ps(acc[j]);
  }
}

// interleaved: for each group of 4 rows, chunks of 16 weights of rows 0..3 in turn
void interleaved(const int8_t* w, const float* x, float* y, int64_t N, int64_t K) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n += 4) {
    const int8_t* p = w + n * K;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 xv = _mm512_loadu_ps(x + k);
      for (int j = 0; j < 4; ++j) {
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + k * 4 + j * 16))));
        acc[j] = _mm512_fmadd_ps(xv, wv, acc[j]);
      }
    }
    for (int j = 0; j < 4; ++j) y[n + j] = _mm512_reduce_add_ps(acc[j]);
  }
}

float sum_f32(const float* a, int64_t n) {
  float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(a + i);
    total += _mm512_reduce_add_ps(v);
  }
  return total;
}

int main() {
  const int64_t N = 1024, K = 2816, count = 60;
  std::vector<std::vector<int8_t>> ws(count, std::vector<int8_t>(N * K)), wi(count, std::vector<int8_t>(N * K));
  for (auto& w : ws) for (auto& v : w) v = int8_t(rand() % 255 - 127);
  for (int c = 0; c < count; ++c)
    for (int64_t n = 0; n < N; n += 4)
      for (int64_t k = 0; k < K; k += 16)
        for (int j = 0; j < 4; ++j) std::memcpy(&wi[c][n * K + k * 4 + j * 16], &ws[c][(n + j) * K + k], 16);
  std::vector<float> x(K, 1.0f), y(N), big(N * K * count / 4, 1.0f);
  const double bytes = double(N * K * count);
  for (int th : {1, 2}) {
    omp_set_num_threads(th);
    double best[3] = {1e9, 1e9, 1e9};
    for (int r = 0; r < 6; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < count; ++c) rowmajor(ws[c].data(), x.data(), y.data(), N, K);
      auto t1 = std::chrono::steady_clock::now();
      for (int c = 0; c < count; ++c) interleaved(wi[c].data(), x.data(), y.data(), N, K);
      auto t2 = std::chrono::steady_clock::now();
      volatile float s = sum_f32(big.data(), int64_t(big.size()));
      (void)s;
      auto t3 = std::chrono::steady_clock::now();
      best[0] = std::min(best[0], std::chrono::duration<double>(t1 - t0).count());
      best[1] = std::min(best[1], std::chrono::duration<double>(t2 - t1).count());
      best[2] = std::min(best[2], std::chrono::duration<double>(t3 - t2).count());
    }
    std::printf("%d threads: row-major 4 streams %.1f GB/s, interleaved one stream %.1f GB/s, sum %.1f GB/s\n", th,
                bytes / best[0] / 1e9, bytes / best[1] / 1e9, bytes / best[2] / 1e9);
  }
}
