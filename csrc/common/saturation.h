// Guards against the u8 x s8 saturation of CPUs without VNNI.
//
// Without VNNI, FBGEMM and oneDNN multiply u8 x s8 with vpmaddubsw, whose int16 sums of two
// products saturate once activations exceed 127 (benchmarks/results/design_measurements.md, "FBGEMM
// depthwise overflow"). FBGEMM's
// depthwise kernel does the same even with VNNI. On such routes the ops accept only 7-bit uint8
// activations ([0, 127]; observers pick that range on these CPUs) and raise ValueError otherwise,
// instead of returning wrong numbers.
#pragma once
#include <ATen/core/Tensor.h>

#include <fbgemm/Utils.h>

#include "cpu/probe.h"

namespace qbackend::saturation {

inline bool fbgemm_has_vnni() {
  const auto isa = fbgemm::fbgemmInstructionSet();
  return isa == fbgemm::inst_set_t::avx512_vnni || isa == fbgemm::inst_set_t::avx512_vnni_ymm;
}

inline bool onednn_has_vnni() { return cpu::has(cpu::Isa::Avx512Vnni) || cpu::avx_vnni_usable(); }

// oneDNN's depthwise convs (groups = in = out channels) do not pair products in int16: without VNNI
// (ONEDNN_MAX_CPU_ISA=AVX2) they are as exact at 8 bits as with it (tests/ops/test_conv2d.py checks
// it against the fp64 reference under QBACKEND_ISA=avx2). Its dense and grouped convs saturate.
inline bool onednn_exact_8bit(bool depthwise) { return onednn_has_vnni() || depthwise; }

// True when every byte of the dense uint8 tensor is <= 127 (one pass, vectorized: SSE2 pmaxub is
// the baseline; ATen's uint8 max reduction is far slower: design_measurements.md, "7-bit check").
inline bool fits_7_bits(const at::Tensor& x_u8) {
  const at::Tensor x = x_u8.is_non_overlapping_and_dense() ? x_u8 : x_u8.contiguous();
  const uint8_t* p = x.const_data_ptr<uint8_t>();
  const int64_t n = x.numel();
  uint8_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m <= 127;
}

// Raises unless x can be multiplied exactly on a route without VNNI.
inline void require_7bit(const at::Tensor& x, const char* provider) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kByte, "x is int8, but this CPU (or QBACKEND_ISA) has no VNNI: ",
                    provider, " int8 kernels saturate u8 x s8 products here. Use uint8 activations in [0, 127] "
                    "(reduce_range=True)");
  TORCH_CHECK_VALUE(fits_7_bits(x), "x has values above 127, but this CPU (or QBACKEND_ISA) has no VNNI: ",
                    provider, " int8 kernels saturate u8 x s8 products here. Quantize activations to 7 bits "
                    "(quant_max=127, reduce_range=True)");
}

}  // namespace qbackend::saturation
