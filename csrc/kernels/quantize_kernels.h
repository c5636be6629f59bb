// Raw quantize/dequantize kernels (no torch headers): one table of function pointers per ISA.
//
// Contract (matches qbackend/ops/reference.py), for every ISA bit for bit:
//   quantize:   q = clamp(round_half_even(x / scale) + zp, qmin, qmax), the division an IEEE fp32
//               division, rounding in the current (default: nearest-even) mode;
//               NaN -> zp, +inf -> qmax, -inf -> qmin (x / scale as computed in fp32).
//   dequantize: y = float(q - zp) * scale in fp32 (one rounding); to bf16 by round-to-nearest-even
//               of that fp32 value (like torch's .to(torch.bfloat16)).
// bf16 values are passed as their uint16_t bit patterns. Pointers need no alignment.
// The caller guarantees scale > 0 finite and zp in [qmin, qmax] (the torch ops validate).
//
// Two forms per operation:
//   per-tensor  (`q_*`, `dq_*`):  one scale / zero point for n contiguous elements;
//   per-element (`qv_*`, `dqv_*`): scale[i], zp[i] for element i < n (per-channel ops call it on a
//                                  row of C*inner elements with scales expanded over `inner`).
// And one layout helper for the channels-last quantize of a channels-first image:
//   interleave_u8(src, stride, C, W, dst): dst[w * C + c] = src[c * stride + w] for c < C, w < W
//   (C planar rows of W bytes -> W pixels of C bytes; SIMD shuffles for C = 3 and 4).
#pragma once
#include <cstdint>

namespace qbackend::kernels {

struct QuantizeKernels {
  const char* name;  // "avx512", "avx2", "scalar"

  void (*q_f32_u8)(const float* x, uint8_t* q, int64_t n, float scale, int32_t zp);
  void (*q_f32_s8)(const float* x, int8_t* q, int64_t n, float scale, int32_t zp);
  void (*q_bf16_u8)(const uint16_t* x, uint8_t* q, int64_t n, float scale, int32_t zp);
  void (*q_bf16_s8)(const uint16_t* x, int8_t* q, int64_t n, float scale, int32_t zp);

  void (*qv_f32_u8)(const float* x, uint8_t* q, int64_t n, const float* scale, const int32_t* zp);
  void (*qv_f32_s8)(const float* x, int8_t* q, int64_t n, const float* scale, const int32_t* zp);
  void (*qv_bf16_u8)(const uint16_t* x, uint8_t* q, int64_t n, const float* scale, const int32_t* zp);
  void (*qv_bf16_s8)(const uint16_t* x, int8_t* q, int64_t n, const float* scale, const int32_t* zp);

  void (*dq_u8_f32)(const uint8_t* q, float* y, int64_t n, float scale, int32_t zp);
  void (*dq_s8_f32)(const int8_t* q, float* y, int64_t n, float scale, int32_t zp);
  void (*dq_u8_bf16)(const uint8_t* q, uint16_t* y, int64_t n, float scale, int32_t zp);
  void (*dq_s8_bf16)(const int8_t* q, uint16_t* y, int64_t n, float scale, int32_t zp);

  void (*dqv_u8_f32)(const uint8_t* q, float* y, int64_t n, const float* scale, const int32_t* zp);
  void (*dqv_s8_f32)(const int8_t* q, float* y, int64_t n, const float* scale, const int32_t* zp);
  void (*dqv_u8_bf16)(const uint8_t* q, uint16_t* y, int64_t n, const float* scale, const int32_t* zp);
  void (*dqv_s8_bf16)(const int8_t* q, uint16_t* y, int64_t n, const float* scale, const int32_t* zp);

  void (*interleave_u8)(const uint8_t* src, int64_t stride, int64_t C, int64_t W, uint8_t* dst);
};

// The portable interleave_u8 (the scalar table's, and the SIMD ones' tails): pixels [w0, W).
inline void interleave_u8_from(const uint8_t* src, int64_t stride, int64_t C, int64_t W, uint8_t* dst,
                               int64_t w0 = 0) {
  for (int64_t w = w0; w < W; ++w)
    for (int64_t c = 0; c < C; ++c) dst[w * C + c] = src[c * stride + w];
}
inline void interleave_u8_scalar(const uint8_t* src, int64_t stride, int64_t C, int64_t W, uint8_t* dst) {
  interleave_u8_from(src, stride, C, W, dst);
}

// Each is defined in its own translation unit (quantize_<isa>.cpp). Only call the AVX ones when
// the CPU/OS support them (qbackend::cpu::has(Isa::Avx512) resp. has(Isa::Avx2)).
const QuantizeKernels& quantize_kernels_avx512();
const QuantizeKernels& quantize_kernels_avx2();
const QuantizeKernels& quantize_kernels_scalar();

// Helper for kernel TUs: fills a table from a template parameterised on the element kernels.
template <template <typename, typename> class Q, template <typename, typename> class QV,
          template <typename, typename> class DQ, template <typename, typename> class DQV>
constexpr QuantizeKernels make_quantize_kernels(
    const char* name, void (*interleave_u8)(const uint8_t*, int64_t, int64_t, int64_t, uint8_t*)) {
  return QuantizeKernels{
      name,
      Q<float, uint8_t>::run, Q<float, int8_t>::run, Q<uint16_t, uint8_t>::run, Q<uint16_t, int8_t>::run,
      QV<float, uint8_t>::run, QV<float, int8_t>::run, QV<uint16_t, uint8_t>::run, QV<uint16_t, int8_t>::run,
      DQ<uint8_t, float>::run, DQ<int8_t, float>::run, DQ<uint8_t, uint16_t>::run, DQ<int8_t, uint16_t>::run,
      DQV<uint8_t, float>::run, DQV<int8_t, float>::run, DQV<uint8_t, uint16_t>::run, DQV<int8_t, uint16_t>::run,
      interleave_u8,
  };
}

template <typename Q> struct QRange;
template <> struct QRange<uint8_t> { static constexpr int32_t min = 0, max = 255; };
template <> struct QRange<int8_t> { static constexpr int32_t min = -128, max = 127; };

}  // namespace qbackend::kernels
