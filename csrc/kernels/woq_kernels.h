// Weight-only int8 and int4 products for decoding and prompts (no torch headers): one table of
// function pointers per ISA.
//
// The weights come in row tiles (WeightTiles below): the rows of output channels in groups of four,
// each group stored as 16-byte chunks of its four rows in turn, so a pass over four channels reads
// one sequential stream, a 64-byte line per 16 bytes of each row. (Four separate row streams reach
// about 40% of a core's DRAM bandwidth on Zen 4; one interleaved stream about 90%:
// benchmarks/results/epyc_zen4/weight_stream_layout.md.)
//
//   gemv_s8(x, ldx, M, w, K, n0, n1, scale, bias, y, ldy):
//       for m < M and n0 <= n < n1:
//         y[m * ldy + n] = scale[n] * sum_k x[m * ldx + k] * float(W[n, k]) (+ bias[n] if bias)
//   x: float32 rows (stride ldx), W int8 [N, K] in row tiles of K bytes a row (per-output-channel
//   scales), y: float32.
//
//   gemv_u4(x, ldx, M, w, K, G, n0, n1, scale, offset, bias, y, ldy):
//       the same with 4-bit weights in groups of G (a multiple of 16) consecutive k of a row:
//         y[m * ldy + n] = sum_k x[m * ldx + k] * (S(n, g) * u(n, k) + O(n, g)) (+ bias[n])
//       where g = k / G, ng = ceil(K / G), u(n, k) in [0, 15] the low (k even) or high (k odd) nibble of
//       byte k / 2 of row n (row tiles of ceil(K / 2) bytes a row), and the group values come in group
//       tiles of float16 (F16 below): S(n, g) = float(scale[group_at(n, g, ng)]), O likewise from offset;
//       each weight is dequantized in float32 by one fused multiply-add.
//
// n0 is a multiple of 4 (a tile's first channel); the rows a tile pads beyond N are computed and not
// stored. The sum is accumulated in float32 in an order each ISA chooses (lanes of 16, 8 or 1 values,
// then a reduction), so results agree across ISAs to float32 rounding, not bit for bit; each weight is
// converted exactly (an int8 is an exact float). Every weight tile is read once per call for up to
// four rows of x (`kRowsPerPass`), so a decode step (M = 1) streams the weights once.
#pragma once
#include <cstdint>

namespace qbackend::kernels {

constexpr int64_t kRowsPerPass = 4;

// The bits of an IEEE float16 (binary16): the 4-bit weights' group scales and offsets, 4 bytes a group
// where two float32 took 8 (a third of an int4 weight's bytes in groups of 32). The scalar units convert
// them with half_to_float (half_float.h), the SIMD units with F16C (f16_lanes.h): the same floats.
using F16 = uint16_t;

// The row-tile layout of a weight of N rows of `row_bytes` bytes: ceil(N / 4) tiles of
// chunks(row_bytes) chunks; chunk c of a tile holds bytes [16c, 16c + 16) of its rows 0..3 in turn
// (64 bytes), zero beyond row_bytes and beyond N. As a tensor: [ceil(N / 4), chunks, 64].
struct WeightTiles {
  static constexpr int64_t kRows = 4, kChunk = 16, kLine = kRows * kChunk;
  static constexpr int64_t chunks(int64_t row_bytes) { return (row_bytes + kChunk - 1) / kChunk; }
  static constexpr int64_t tile_bytes(int64_t row_bytes) { return chunks(row_bytes) * kLine; }
  // Byte b of row j (0..3) of the tile at `tile`.
  template <typename T>
  static constexpr T* at(T* tile, int64_t j, int64_t b) {
    return tile + (b / kChunk) * kLine + j * kChunk + b % kChunk;
  }
  // Group tiles: per-group values of the rows (the 4-bit weights' scales and offsets) as
  // [ceil(N / 4), ng, 4], the four rows of a tile side by side for each group (zero for padding rows).
  // The index of row n's value for group g, and where a tile's values begin.
  static constexpr int64_t group_at(int64_t n, int64_t g, int64_t ng) {
    return n / kRows * ng * kRows + g * kRows + n % kRows;
  }
  static constexpr int64_t group_tile(int64_t n, int64_t ng) { return n / kRows * ng * kRows; }
};

struct WoqKernels {
  const char* name;  // "avx512", "avx2", "scalar"
  void (*gemv_s8)(const float* x, int64_t ldx, int64_t M, const int8_t* w, int64_t K, int64_t n0, int64_t n1,
                  const float* scale, const float* bias, float* y, int64_t ldy);
  void (*gemv_u4)(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t K, int64_t G, int64_t n0,
                  int64_t n1, const F16* scale, const F16* offset, const float* bias, float* y, int64_t ldy);
};

// Each is defined in its own translation unit (woq_<isa>.cpp). Only call the AVX ones when
// qbackend::cpu::has() says the CPU (and the QBACKEND_ISA cap) allows them.
const WoqKernels& woq_kernels_avx512();
const WoqKernels& woq_kernels_avx2();
const WoqKernels& woq_kernels_scalar();

}  // namespace qbackend::kernels
