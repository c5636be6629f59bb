// AMX tile-stream benchmark (a standalone program, not part of the extension): what feeds AMX-INT8's
// tile dot products on one core. The loop is the native AMX kernel's inner step (gemm_amx.cpp): four
// int32 C tiles from two A tiles and two B tiles, 16 x 64 bytes each, four tdpbusd per step (2 KB of A,
// 2 KB of B). Cases, each against the peak (the same four tdpbusd with no loads):
//   * where the operands come from: A and B cycled through spans of a given size (L1, L2, memory),
//     64-byte aligned, and the same with A's rows 16 bytes off alignment (every tile row two lines);
//   * what a step can carry beside its tiles: N vector FMAs (8 chains in registers), or N epilogue rows (a load, an FMA, a
//     conversion and a 16-byte store each), or N epilogue rows without the store;
//   * C tiles stored to a 4 KB buffer and zeroed every S steps (a block of S x 64 k), with and without
//     an epilogue over the stored sums (64 rows of 16 int32 -> u8) before the next block.
//
//   g++ -O2 -mamx-tile -mamx-int8 -mavx512f -mavx512bw -mavx512vl -mfma benchmarks/amx_tile_streams.cpp -o /tmp/ats
//   /tmp/ats            (Linux 5.16+ on an AMX CPU: it asks for the tile-data permission first)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint8_t* buffer(int64_t bytes, int64_t offset) {
  const int64_t n = (bytes + 65536 + 4095) / 4096 * 4096;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, n));
  std::memset(p, 1, n);
  return p + offset;
}

struct Case {
  int64_t span_a = 8192, span_b = 8192;  // bytes each operand cycles through
  int64_t misalign_a = 0;               // A's offset from 64-byte alignment
  bool loads = true;                    // false: the peak loop
  int fmas = 0, epilogue_rows = 0;      // per step
  bool epilogue_stores = true;
  int block_steps = 0;                  // store and zero C every this many steps (0: never)
  bool block_epilogue = false;
};

// int8 TOPS of one case on this thread (2 ops per multiply-add), best of 3.
double run(const Case& c) {
  uint8_t* a = buffer(c.span_a, c.misalign_a);
  uint8_t* b = buffer(c.span_b, 0);
  auto* sums = static_cast<int32_t*>(std::aligned_alloc(64, 4096));
  auto* rows = static_cast<float*>(std::aligned_alloc(64, 16384));
  uint8_t* out = buffer(1 << 20, 0);
  std::memset(sums, 0, 4096);
  std::memset(rows, 0, 16384);
  const int64_t steps = 400000;
  __m512 f0 = _mm512_set1_ps(1.0f), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0;
  const __m512 fm = _mm512_set1_ps(0.999f), fa = _mm512_set1_ps(0.001f);
  __m512 sink = _mm512_setzero_ps();
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const double t0 = now();
    int64_t oa = 0, ob = 0, r = 0;
    for (int64_t i = 0; i < steps; ++i) {
      if (c.loads) {
        const uint8_t* pa = a + oa;
        const uint8_t* pb = b + ob;
        _tile_loadd(4, pa, 64);
        _tile_loadd(6, pb, 128);
        _tile_dpbusd(0, 4, 6);
        _tile_loadd(7, pb + 64, 128);
        _tile_dpbusd(1, 4, 7);
        _tile_loadd(5, pa + 1024, 64);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
        oa = oa + 2048 >= c.span_a ? 0 : oa + 2048;
        ob = ob + 2048 >= c.span_b ? 0 : ob + 2048;
      } else {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
      }
      for (int j = 0; j < c.fmas; j += 8) {  // eight independent chains, in registers
        f0 = _mm512_fmadd_ps(f0, fm, fa);
        f1 = _mm512_fmadd_ps(f1, fm, fa);
        f2 = _mm512_fmadd_ps(f2, fm, fa);
        f3 = _mm512_fmadd_ps(f3, fm, fa);
        f4 = _mm512_fmadd_ps(f4, fm, fa);
        f5 = _mm512_fmadd_ps(f5, fm, fa);
        f6 = _mm512_fmadd_ps(f6, fm, fa);
        f7 = _mm512_fmadd_ps(f7, fm, fa);
      }
      for (int j = 0; j < c.epilogue_rows; ++j, ++r) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_fmadd_ps(_mm512_load_ps(rows + (r & 255) * 16), fm, fa));
        if (c.epilogue_stores) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + ((r * 16) & ((1 << 20) - 1))), _mm512_cvtusepi32_epi8(q));
        else sink = _mm512_add_ps(sink, _mm512_castsi512_ps(q));
      }
      if (c.block_steps && i % c.block_steps == c.block_steps - 1) {
        _tile_stored(0, sums, 128);
        _tile_stored(1, sums + 16, 128);
        _tile_stored(2, sums + 512, 128);
        _tile_stored(3, sums + 528, 128);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        if (c.block_epilogue)
          for (int j = 0; j < 64; ++j, ++r) {
            const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + j * 16)), fm, fa);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + ((r * 16) & ((1 << 20) - 1))),
                             _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(y)));
          }
      }
    }
    best = std::min(best, now() - t0);
  }
  sink = _mm512_add_ps(sink, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3)),
                                          _mm512_add_ps(_mm512_add_ps(f4, f5), _mm512_add_ps(f6, f7))));
  volatile float keep = _mm512_reduce_add_ps(sink);
  (void)keep;
  std::free(a - c.misalign_a);
  std::free(b);
  std::free(sums);
  std::free(rows);
  std::free(out);
  return 4.0 * steps * 16 * 16 * 64 * 2 / best / 1e12;
}

}  // namespace

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
    std::printf("no AMX tile-data permission on this CPU / kernel\n");
    return 1;
  }
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  auto row = [](const char* what, const Case& c) { std::printf("| %s | %.2f |\n", what, run(c)); };
  std::printf("| case (one core; 4 tdpbusd a step, 2 KB of A and 2 KB of B loaded) | int8 TOPS |\n|---|---|\n");
  Case peak;
  peak.loads = false;
  row("peak: the same tdpbusd, no loads", peak);
  const int64_t kL1 = 8192, kL2 = 1 << 20, kMem = 64 << 20;
  const struct { const char* name; int64_t a, b; } spans[] = {
      {"A 8 KB, B 8 KB (L1)", kL1, kL1},          {"A 64 KB, B 8 KB", 64 << 10, kL1},
      {"A 1 MB (L2), B 8 KB (L1)", kL2, kL1},     {"A 8 KB (L1), B 1 MB (L2)", kL1, kL2},
      {"A 64 KB, B 64 KB (L2)", 64 << 10, 64 << 10}, {"A 256 KB, B 256 KB (L2)", 256 << 10, 256 << 10},
      {"A 1 MB, B 1 MB (L2)", kL2, kL2},          {"A 64 MB (memory), B 8 KB", kMem, kL1}};
  for (const auto& s : spans) {
    Case c;
    c.span_a = s.a;
    c.span_b = s.b;
    row(s.name, c);
  }
  Case misaligned;
  misaligned.span_a = kL2;
  misaligned.misalign_a = 16;
  row("A 1 MB with rows 16 bytes off 64-byte alignment, B 8 KB", misaligned);
  misaligned.span_a = kL1;
  row("A 8 KB with rows 16 bytes off 64-byte alignment, B 8 KB", misaligned);
  // Beside the tiles: A streams from 64 KB, B stays in L1; `label` takes the count.
  auto beside = [&](const char* label, int n, auto&& set) {
    Case c;
    c.span_a = 64 << 10;
    set(c);
    char what[96];
    std::snprintf(what, sizeof what, label, n);
    row(what, c);
  };
  for (int n : {8, 16, 32, 64}) beside("A 64 KB, B 8 KB, + %d vector FMAs a step", n, [&](Case& c) { c.fmas = n; });
  for (int n : {4, 8, 16}) {
    beside("A 64 KB, B 8 KB, + %d epilogue rows a step (16-byte stores)", n, [&](Case& c) { c.epilogue_rows = n; });
    beside("A 64 KB, B 8 KB, + %d epilogue rows a step, no stores", n, [&](Case& c) {
      c.epilogue_rows = n;
      c.epilogue_stores = false;
    });
  }
  for (int n : {4, 9, 12, 48}) {
    beside("A 64 KB, B 8 KB, C stored and zeroed every %d steps", n, [&](Case& c) { c.block_steps = n; });
    beside("the same (%d steps), + a 32 x 32 u8 epilogue after each store", n, [&](Case& c) {
      c.block_steps = n;
      c.block_epilogue = true;
    });
  }
  _tile_release();
  return 0;
}
