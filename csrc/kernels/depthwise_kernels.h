// qbackend's own depthwise int8 conv (the native provider's depthwise route): channels-last u8/s8
// activations, one int8 filter per channel (groups = channels, multiplier 1), any kernel, stride,
// padding and dilation, and the native GEMM's fused epilogue (gemm_kernels.h: per-channel scale,
// bias, residual, relu/gelu, u8/s8/fp32/bf16 output). No torch headers: csrc/providers/native_depthwise.cpp
// validates the arguments and calls these kernels.
//
// Arithmetic: acc[c] = sum_{kh,kw} xu[c] * w[c][kh][kw] - xu_zp * colsum[c] in exact int32 (every
// product is at most 255 * 128 in magnitude; a kernel of at most 512 taps keeps the sums far below
// 2^31), where xu is the activation's uint8 view (int8 bytes read as x ^ 0x80, zero point + 128)
// and the padding reads xu_zp. The taps of a kernel row go in groups of 4 along kw (the last group
// zero-weighted past KW), so one u8 x s8 dot-product instruction (vpdpbusd) adds 4 taps of 16
// channels. Each input row is laid out once per thread and 64-channel block as those 4-byte tap
// groups ("tap rows", below) and read by every output row that covers it.
//
// Channel order of the lanes (tap rows, packed weight, accumulators): within each whole block of
// 64 channels, lane 16 j + 4 l + i holds channel 16 l + 4 j + i (the order in which interleaving
// the bytes of 4 input columns, 64 channels each, leaves them; packing the int32 results to bytes
// undoes it). Channels of a last block of fewer than 64 keep their own order.
//
// Packed weight (the provider's header aside): int32 colsum [Cp] (sum of each channel's taps, 0 in
// the padding), then int8 w4 [KH][G][Cp][4] with w4[kh][g][lane(c)][t] = w[c][kh][4g + t] (0 where
// 4g + t >= KW or c >= C); G = ceil(KW / 4), Cp = C rounded up to 16. Then, for the AVX2 kernel,
// int32 w32 [KH][P][Cp] in channel order, the taps of a kernel row in pairs (P = ceil(KW / 2)):
// w[c][kh][2p] in the low int16 of the lane, w[c][kh][2p + 1] in the high one (0 past KW and
// beyond C), so one int16 dot product (vpmaddwd) adds two taps of 8 channels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_kernels.h"

namespace qbackend::kernels {

constexpr int64_t kDepthwiseMaxTaps = 512;  // KH * KW (64 per side at most)

inline int64_t depthwise_cp(int64_t C) { return (C + 15) / 16 * 16; }  // channels padded to vectors
inline int64_t depthwise_groups(int64_t KW) { return (KW + 3) / 4; }    // 4-tap groups per kernel row
inline int64_t depthwise_pairs(int64_t KW) { return (KW + 1) / 2; }     // tap pairs per kernel row (AVX2)
// Channels in whole 64-channel blocks (their lanes interleaved, above).
inline int64_t depthwise_whole_blocks(int64_t C) { return C / 64 * 64; }
// The lane of channel c (above).
inline int64_t depthwise_lane(int64_t C, int64_t c) {
  if (c >= depthwise_whole_blocks(C)) return c;
  const int64_t b = c / 64 * 64, l = (c % 64) / 16, j = (c % 16) / 4, i = c % 4;
  return b + 16 * j + 4 * l + i;
}

struct DepthwiseArgs {
  const uint8_t* x = nullptr;  // [N, H, W, C] bytes (u8, or s8 when x_int8), or the rows of it from x_row0 on
  int64_t x_row0 = 0;          // the input row (n * H + ih) that x's first row holds
  bool x_int8 = false;
  int32_t x_zp = 0;            // in x's own dtype
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0, KH = 0, KW = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  const int8_t* w = nullptr;   // w4 [KH][G][Cp][4] (header comment)
  const int32_t* w32 = nullptr;  // w32 [KH][P][Cp] (header comment): the AVX2 kernel's
  // The epilogue's arguments, one GEMM "row" per output pixel ((n * OH + oh) * OW + ow) and one
  // "column" per channel: N = C, ldc = C, colsum = the packed weight's [Cp] sums; a/b unused (the
  // kernel passes the uint8 view's zero point to the epilogue itself).
  GemmArgs epi;
  int64_t out_pixel0 = 0;      // the output pixel that epi's row 0 (out, residual) holds
  // The tap rows the previous call on the same scratch built are still valid: this call has the
  // same arguments but for x, x_row0, out and out_pixel0, and x holds the same values for every
  // input row the two calls share. A caller computing an image in tiles of rows sets it after the
  // first tile, so the rows two tiles share are laid out once.
  bool keep_rings = false;
};

// Input rows an output row's taps span: the slots of the ring of laid-out input rows each kernel
// keeps per thread (slot ih % ring rows: every output row finds the rows it reads in the ring).
inline int64_t depthwise_ring_rows(const DepthwiseArgs& a) { return (a.KH - 1) * a.dh + 1; }

// The laid-out input rows the taps of output row (n, oh) read, into rows[0 .. KH): for a row inside
// the image its slot of `ring` (depthwise_ring_rows(a) slots of `lanes` elements, slot ih % those;
// tags[slot]: the n * H + ih the slot holds, -1 none), laid out by build(ih, slot) when the slot
// holds another row; for a row outside, `pad` (`lanes` elements, every byte pad_byte), filled the
// first time one is read (pad_filled).
template <class T, class Build>
inline void depthwise_input_rows(const DepthwiseArgs& a, int64_t n, int64_t oh, T* ring, int64_t lanes, int64_t* tags,
                                 T* pad, uint8_t pad_byte, bool& pad_filled, Build build, const T** rows) {
  for (int64_t kh = 0; kh < a.KH; ++kh) {
    const int64_t ih = oh * a.sh - a.ph + kh * a.dh;
    if (ih < 0 || ih >= a.H) {
      if (!pad_filled) {
        std::memset(pad, pad_byte, static_cast<size_t>(lanes) * sizeof(T));
        pad_filled = true;
      }
      rows[kh] = pad;
      continue;
    }
    const int64_t slot = ih % depthwise_ring_rows(a);
    T* buf = ring + slot * lanes;
    if (tags[slot] != n * a.H + ih) {
      build(ih, buf);
      tags[slot] = n * a.H + ih;
    }
    rows[kh] = buf;
  }
}

// Scratch bytes one thread needs (its ring of tap rows and one row of padding).
size_t depthwise_scratch_bytes(const DepthwiseArgs& a);
// Computes output rows [row_begin, row_end) (row = n * OH + oh); call only when
// qbackend::cpu::has(qbackend::cpu::Isa::Avx512Vnni). scratch: depthwise_scratch_bytes, 64-byte aligned.
void depthwise_rows_avx512(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, uint8_t* scratch);
// The same on AVX2 (depthwise_avx2.cpp: int16 products, exact at 8 bits; reads w32, not w; x_row0,
// out_pixel0 and keep_rings as above); call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
size_t depthwise_scratch_bytes_avx2(const DepthwiseArgs& a);
void depthwise_rows_avx2(const DepthwiseArgs& a, int64_t row_begin, int64_t row_end, uint8_t* scratch);

}  // namespace qbackend::kernels
