// qbackend's own int8 GEMM (the "native" provider): u8 activations x s8 symmetric per-channel
// weights, exact int32 accumulation, and a fused epilogue. No torch headers: the ops in
// csrc/providers/native_linear.cpp validate the arguments and call these kernels.
//
// Packed weight ("panels"), built once by gemm_pack_b from the int8 weight w [N, K] (row-major):
//   Kp = K rounded up to 4, Np = N rounded up to 16; panels of 64 output columns (the last one may
//   hold 16, 32 or 48). Panel p starts at byte p * 64 * Kp and holds, for each group of 4 k's
//   (k4 = 0 .. Kp/4 - 1) and each 16-column vector v of the panel, 64 bytes:
//       byte[c * 4 + j] = w[p * 64 + v * 16 + c][k4 * 4 + j]      (0 beyond N or K)
//   which is the operand layout of one u8 x s8 dot-product instruction (vpdpbusd: 16 int32 lanes,
//   4 bytes each). colsum[n] = sum_k w[n][k] (0 in the padding) gives the zero-point correction.
//
// Arithmetic contract (qbackend/ops/reference.py):
//   acc[m][n] = sum_k a[m][k] * w[n][k] - a_zp * colsum[n]   (exact int32: needs K <= 65536)
//   y = float(acc) * (x_scale * w_scale[n]) + bias[n]          (fp32, one fma)
//   y += float(r[m][n] - r_zp) * r_scale                       (optional residual r, u8/s8)
//   y = post(y)                                                (relu; gelu with an erf accurate to 2e-7)
//   out = y (fp32) | bf16(y) (round to nearest even) | clamp(round_half_even(y * (1 / out_scale)) + out_zp)
// a_int8: the activation bytes are int8 and are read as (a ^ 0x80), i.e. uint8 with a_zp + 128
// (the caller passes the shifted zero point).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

namespace qbackend::kernels {

constexpr int64_t kGemmPanel = 64;  // output columns per panel

inline int64_t gemm_kp(int64_t K) { return (K + 3) / 4 * 4; }
inline int64_t gemm_np(int64_t N) { return (N + 15) / 16 * 16; }
inline int64_t gemm_num_panels(int64_t N) { return (N + kGemmPanel - 1) / kGemmPanel; }

enum class GemmOut : int { f32 = 0, bf16 = 1, u8 = 2, s8 = 3 };
enum class GemmPost : int { none = 0, relu = 1, gelu = 2 };

struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const uint8_t* a = nullptr;  // [M, lda] activation bytes
  int64_t lda = 0;
  bool a_cached = false;       // the caller has just written the rows (in L1/L2): nothing to read ahead
  bool a_int8 = false;
  int32_t a_zp = 0;            // zero point of the uint8 view
  const int8_t* b = nullptr;   // packed panels
  bool b_7bit = false;         // every weight in [-64, 64] (the AVX2 pair-product kernel is exact on them)
  const int32_t* colsum = nullptr;  // [Np]
  const float* w_scales = nullptr;  // [N]
  const float* bias = nullptr;      // [N] or nullptr
  float x_scale = 1.0f;
  const uint8_t* r = nullptr;  // residual [M, ldr] (u8 or s8 bytes) or nullptr
  int64_t ldr = 0;
  bool r_int8 = false;
  int32_t r_zp = 0;
  float r_scale = 1.0f;
  GemmPost post = GemmPost::none;
  GemmOut out_type = GemmOut::f32;
  void* out = nullptr;         // [M, ldc] elements of out_type
  int64_t ldc = 0;
  float out_inv_scale = 1.0f;
  int32_t out_zp = 0;
};

// Whether the epilogue requantizes to 8-bit integers without gelu: the case every kernel runs in
// its folded form (scale, bias and residual scale times 1 / out_scale; clamp and narrow).
inline bool requantizes_without_gelu(const GemmArgs& g) {
  return (g.out_type == GemmOut::u8 || g.out_type == GemmOut::s8) && g.post != GemmPost::gelu;
}

// Computes rows [m_begin, m_end) x panels [panel_begin, panel_end) of the output.
using GemmFn = void (*)(const GemmArgs&, int64_t m_begin, int64_t m_end, int64_t panel_begin,
                        int64_t panel_end);

// Whether the AVX512-VNNI kernel's row tiles read the next tile's activation rows ahead into L1 where
// the sweep reads them from L3 or memory (gemm_avx512_vnni_impl.h); true by default. A switch for
// tests and benchmarks (benchmarks/rows_read_ahead.py): either way the same output bytes.
bool rows_read_ahead();
void set_rows_read_ahead(bool enabled);

// A convolution with groups 1 and C a multiple of 64 as one GEMM per band of output rows, without
// gathered taps ("direct"; conv_amx.cpp). The band's input is copied into `scratch` as sh x sw
// phase planes padded with the zero point's byte: plane (py, px) holds padded input pixel
// (sh * (oh_begin + Y) + py, sw * X + px) at (Y, X), Wq = direct_plane_width() pixels a row (stride 1:
// one plane, the padded rows themselves). Output pixel (oh, ow) is row q = (oh - oh_begin) * Wq + ow,
// and tap (kh, kw) of row q is pixel q + (kh * dh / sh) * Wq + kw * dw / sw of plane
// ((kh * dh) % sh, (kw * dw) % sw): every tap of every row at a constant offset, read in place with
// the pixel stride C. g: the GEMM's weight (the packed conv weight, K = KH * KW * C), scales, bias,
// post-op and output type; g.out / g.r are the channels-last output and residual
// [N, OH, OW, N_out] (ldc = ldr = N_out); g.M, g.a and g.lda are not read. Same sums and epilogue as
// the GEMM over gathered taps, so the same output bytes. At most kDirectConvMaxTaps taps.
struct DirectConvArgs {
  GemmArgs g;
  const uint8_t* x = nullptr;  // channels-last [batch, H, W, C]
  int64_t C = 0, H = 0, W = 0, OH = 0, OW = 0, KH = 1, KW = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  uint8_t pad = 0;  // the activation's zero point as a byte
};

constexpr int64_t kDirectConvRowBlock = 32;  // q's per block of the direct conv
constexpr int64_t kDirectConvMaxTaps = 64;

// Pixels per row of a phase plane: the output's columns and the kernel's reach beyond them.
inline int64_t direct_plane_width(const DirectConvArgs& a) { return a.OW + (a.KW - 1) * a.dw / a.sw; }
// Pixels per phase plane for a band of `rows` output rows: its rows, one more, and a block of q's
// (what the taps of the band's last block read past its rows).
inline int64_t direct_plane_pixels(const DirectConvArgs& a, int64_t rows) {
  return (rows + (a.KH - 1) * a.dh / a.sh + 1) * direct_plane_width(a) + kDirectConvRowBlock;
}
// Bytes of scratch a band of `rows` output rows needs (64-byte aligned by the caller).
inline int64_t direct_conv_scratch_bytes(const DirectConvArgs& a, int64_t rows) {
  return a.sh * a.sw * direct_plane_pixels(a, rows) * a.C;
}

// Computes output rows [oh_begin, oh_end) of image n, columns of panels [panel_begin, panel_end)
// (scratch: direct_conv_scratch_bytes of the rows).
using DirectConvFn = void (*)(const DirectConvArgs&, int64_t n, int64_t oh_begin, int64_t oh_end, int64_t panel_begin,
                              int64_t panel_end, uint8_t* scratch);

struct GemmKernels {
  const char* name;  // "amx", "avx512_vnni", "avx2_vnni", "avx2", "amx_emulated"
  GemmFn gemm;
  int64_t row_tile;  // rows of the kernel's tile: a split of the rows over threads keeps to multiples
  // Runs `iters` iterations of a loop of independent u8 x s8 dot products on this thread and
  // returns the int8 operations it did (2 per multiply-add): the ISA's peak, for the benchmark.
  double (*peak_loop)(int64_t iters);
  // The direct convolution (DirectConvArgs), or nullptr where this kernel has none, and the convs it
  // takes: with direct_conv_stride1, stride 1 only; with direct_conv_max_weight > 0, packed weights
  // of at most that many bytes (K x N_out) only. Elsewhere the gathered taps run.
  DirectConvFn direct_conv = nullptr;
  bool direct_conv_stride1 = false;
  int64_t direct_conv_max_weight = 0;
};

// Defined in gemm_avx512_vnni.cpp; call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx512Vnni).
const GemmKernels& gemm_kernels_avx512_vnni();
// Defined in gemm_avx2_vnni.cpp; call only when qbackend::cpu::avx_vnni_usable().
const GemmKernels& gemm_kernels_avx2_vnni();
// Defined in gemm_avx2.cpp: AVX2 without VNNI, products widened to int16 (vpmaddwd), exact at 8 bits;
// call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
const GemmKernels& gemm_kernels_avx2();
// Defined in gemm_avx2_pairs.cpp: AVX2 without VNNI on 7-bit weights (every |w| <= 64: pair products,
// vpmaddubsw, exact there and only there); call only when qbackend::cpu::has(qbackend::cpu::Isa::Avx2).
const GemmKernels& gemm_kernels_avx2_pairs();
// Defined in gemm_avx2_vnni_evex.cpp: the AVX-VNNI kernel's code on the EVEX form of the instruction,
// for testing it where the CPU has AVX512-VNNI but no AVX-VNNI; call only when has(Isa::Avx512Vnni).
const GemmKernels& gemm_kernels_avx2_vnni_evex();
// Defined in gemm_amx.cpp. The AMX kernel: call only when has(Isa::Amx) (AMX-INT8 and the OS's
// tile permission). The emulated one runs the same kernel code with AMX's tile instructions
// emulated in C++ (slow): it tests the AMX kernel's blocking, tile configuration and remainders on
// any AVX512-VNNI CPU (has(Isa::Avx512Vnni)).
const GemmKernels& gemm_kernels_amx();
const GemmKernels& gemm_kernels_amx_emulated();
// Defined in conv_avx512_vnni.cpp: the AVX512-VNNI kernel's direct convolution (register tiles);
// call only when has(Isa::Avx512Vnni).
DirectConvFn direct_conv_avx512_vnni();
// Defined in conv_amx.cpp: the AMX kernels' direct convolution, on the hardware and the emulated tiles.
DirectConvFn direct_conv_amx();
DirectConvFn direct_conv_amx_emulated();
// Compares the AMX kernel (or the emulated one) with the VNNI kernel and with exact int64 sums on
// problems that cover every tile block and remainder: "" when all agree, else the first difference.
// Needs has(Isa::Amx) (>= 3 for the emulated one).
std::string gemm_amx_self_check(bool emulated);

// Scalar packing (gemm_pack.cpp): packed must hold gemm_np(N) * gemm_kp(K) bytes, colsum gemm_np(N).
void gemm_pack_b(const int8_t* w, int64_t N, int64_t K, int8_t* packed, int32_t* colsum);

}  // namespace qbackend::kernels
