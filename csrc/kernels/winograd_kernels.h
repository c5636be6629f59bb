// The native 3x3 stride-1 convolution on Winograd's F(2x2, 3x3) transform, exact in integers, for
// AVX2 CPUs without VNNI (winograd_avx2.cpp). No torch headers.
//
// Each 2 x 2 block of output pixels ("tile") is Y = A^T [U (.) V] A, with V = B^T d B the transform of
// its 4 x 4 input window d (x - x_zp, zero in the padding), U = (2G) g (2G)^T = 4 G g G^T the
// transform of the 3 x 3 filter g, (.) the elementwise product summed over the input channels, and
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], 2G = [2 0 0; 1 1 1; 1 -1 1; 0 0 2],
//   A^T = [1 1 1 0; 0 1 -1 -1]:
// 16 products per 2 x 2 outputs and channel pair where the direct conv takes 36. In integers:
// |d| <= 255, so |V| <= 4 * 255 = 1020 and |U| <= 9 * 128 = 1152 (both int16), a pair of products
// (vpmaddwd) at most 2 * 1020 * 1152 in magnitude; the sums over channels and the output transform
// are int32 additions, exact modulo 2^32, and their result A^T [U (.) V] A = 4 Y is exact wherever
// |4 Y| < 2^31, which |Y| <= 9 * C * 255 * 128 guarantees for C <= kWinogradMaxChannels. Y is then
// the direct conv's int32 sum (zero point already subtracted): the same bytes out of the same
// epilogue as the GEMM over gathered taps (gemm_kernels.h's contract, with a_zp = 0).
//
// Packed filter (int16), made by winograd_pack from w [N][C][3][3] (int8):
//   Cp = C rounded up to 16, NV = ceil(N / 16) vectors of 16 output channels;
//   u[((v * 16 + xi) * (Cp / 2) + c2) * 32 + col * 2 + j] = U_xi[n = v * 16 + col][c = 2 * c2 + j]
//   (xi = 4 * row + column of the 4 x 4 transform; 0 past N or C): for each vector and position,
//   the channel pairs of 16 columns, 64 bytes each, the operand of two vpmaddwd; a block of tiles
//   reads the whole filter in this order, one stream.
#pragma once
#include <cstdint>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {

constexpr int64_t kWinogradMaxChannels = 1824;  // 4 * 9 * C * 255 * 128 < 2^31

inline int64_t winograd_cp(int64_t C) { return (C + 15) / 16 * 16; }
inline int64_t winograd_packed_elems(int64_t N, int64_t C) { return 16 * gemm_np(N) * winograd_cp(C); }

// u must hold winograd_packed_elems(N, C) int16.
void winograd_pack(const int8_t* w, int64_t N, int64_t C, int16_t* u);

struct WinogradArgs {
  const uint8_t* x = nullptr;  // channels-last [batch, H, W, C], uint8 or (x_int8) int8 bytes
  bool x_int8 = false;
  int32_t x_zp = 0;            // in x's own type
  int64_t C = 0, H = 0, W = 0, OH = 0, OW = 0, ph = 0, pw = 0;
  const int16_t* u = nullptr;  // winograd_pack's filter
  // The epilogue (gemm_kernels.h): N, w_scales, bias, x_scale, residual, post-op and output
  // ([batch, OH, OW, N] channels-last, ldc = ldr = N); a_zp 0 (the zero point is subtracted before
  // the products, so the epilogue's colsum * a_zp is 0; colsum: any gemm_np(N) int32s, the packed
  // weight's); M, K, a and b are not read.
  GemmArgs g;
};

// Tiles per image: ceil(OH / 2) x ceil(OW / 2), row by row; tile t of the batch is image t / that.
inline int64_t winograd_tiles_per_image(const WinogradArgs& a) { return (a.OH + 1) / 2 * ((a.OW + 1) / 2); }
// The most tiles a block transforms at once (a multiple of 6, the kernel's rows), and the scratch
// bytes a block needs (64-byte aligned by the caller).
int64_t winograd_block_tiles(int64_t C);
int64_t winograd_scratch_bytes(int64_t C);

// Computes the output pixels of tiles [t_begin, t_end) of the batch (scratch: winograd_scratch_bytes).
// Call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2); C <= kWinogradMaxChannels.
void winograd_conv_avx2(const WinogradArgs& a, int64_t t_begin, int64_t t_end, uint8_t* scratch);

}  // namespace qbackend::kernels
