// The native provider's depthwise convs: packed weight and thread split (native_depthwise.h).
#include "providers/native_depthwise.h"

#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "cpu/probe.h"
#include "runtime/parallel.h"

namespace qbackend::native {
namespace {

constexpr char kMagic[8] = {'Q', 'B', 'N', 'D', 'W', 'C', '0', '4'};
constexpr int64_t kHeaderBytes = 64;
// Multiply-adds below which a conv runs on the calling thread (a region costs a few us).
constexpr int64_t kParallelWork = int64_t(1) << 17;

int64_t packed_bytes(int64_t C, int64_t KH, int64_t KW) {
  const int64_t Cp = kernels::depthwise_cp(C);
  return kHeaderBytes + 4 * Cp + 4 * KH * kernels::depthwise_groups(KW) * Cp + 4 * KH * kernels::depthwise_pairs(KW) * Cp;
}

// A buffer per thread for the ring of tap rows, grown as needed and kept.
uint8_t* scratch(size_t bytes) {
  static thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace

std::string depthwise_refusal(const at::Tensor& weight, int64_t groups) {
  const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
  if (weight.size(1) != 1 || groups != OC)
    return "it runs convolutions with groups 1, or depthwise ones (groups = in_channels = out_channels)";
  if (KH * KW > kernels::kDepthwiseMaxTaps || KH > 64 || KW > 64)
    return "its depthwise kernels take up to 512 taps, 64 per side";
  return "";
}

at::Tensor pack_depthwise(const at::Tensor& weight) {
  const int64_t C = weight.size(0), KH = weight.size(2), KW = weight.size(3), Cp = kernels::depthwise_cp(C);
  const int64_t taps = KH * KW, bytes = packed_bytes(C, KH, KW);
  at::Tensor out = at::zeros({KH, KW, (bytes + taps - 1) / taps}, at::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  std::memcpy(p, kMagic, 8);
  std::memcpy(p + 8, &C, 8);
  std::memcpy(p + 16, &KH, 8);
  std::memcpy(p + 24, &KW, 8);
  const int64_t G = kernels::depthwise_groups(KW);
  int32_t* colsum = reinterpret_cast<int32_t*>(p + kHeaderBytes);
  int8_t* w4 = reinterpret_cast<int8_t*>(p + kHeaderBytes + 4 * Cp);
  int32_t* w32 = reinterpret_cast<int32_t*>(p + kHeaderBytes + 4 * Cp + 4 * KH * G * Cp);
  const at::Tensor wc = weight.contiguous();
  const int8_t* src = wc.const_data_ptr<int8_t>();
  for (int64_t c = 0; c < C; ++c) {
    const int64_t lane = kernels::depthwise_lane(C, c);
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) {
        const int8_t v = src[(c * KH + kh) * KW + kw];
        colsum[lane] += v;
        w4[((kh * G + kw / 4) * Cp + lane) * 4 + kw % 4] = v;
        // the pair's low or high int16 (bit pattern: the high half may be negative)
        const uint32_t half = static_cast<uint16_t>(static_cast<int16_t>(v));
        uint32_t& lane32 = reinterpret_cast<uint32_t&>(w32[(kh * kernels::depthwise_pairs(KW) + kw / 2) * Cp + c]);
        lane32 |= kw % 2 ? half << 16 : half;
      }
  }
  return out;
}

bool is_depthwise(const at::Tensor& packed) {
  return packed.defined() && packed.device().is_cpu() && packed.scalar_type() == at::kByte &&
         packed.is_contiguous() && packed.numel() >= kHeaderBytes &&
         std::memcmp(packed.const_data_ptr<uint8_t>(), kMagic, 8) == 0;
}

DepthwiseView unpack_depthwise(const at::Tensor& packed, const char* name) {
  TORCH_CHECK_VALUE(is_depthwise(packed) && packed.dim() == 3, name, " is not a native packed depthwise weight");
  const uint8_t* p = packed.const_data_ptr<uint8_t>();
  DepthwiseView v;
  std::memcpy(&v.C, p + 8, 8);
  std::memcpy(&v.KH, p + 16, 8);
  std::memcpy(&v.KW, p + 24, 8);
  const bool sane = v.C > 0 && v.C < (int64_t(1) << 24) && v.KH > 0 && v.KW > 0 && v.KH <= 64 && v.KW <= 64 &&
                    v.KH * v.KW <= kernels::kDepthwiseMaxTaps;
  const int64_t taps = sane ? v.KH * v.KW : 1;
  TORCH_CHECK_VALUE(sane && packed.size(0) == v.KH && packed.size(1) == v.KW &&
                        packed.size(2) == (packed_bytes(v.C, v.KH, v.KW) + taps - 1) / taps,
                    name, " is not a native packed weight for a conv (its header, shape or size does not match)");
  const int64_t Cp = kernels::depthwise_cp(v.C);
  v.colsum = reinterpret_cast<const int32_t*>(p + kHeaderBytes);
  v.w = reinterpret_cast<const int8_t*>(p + kHeaderBytes + 4 * Cp);
  v.w32 = reinterpret_cast<const int32_t*>(p + kHeaderBytes + 4 * Cp + 4 * v.KH * kernels::depthwise_groups(v.KW) * Cp);
  return v;
}

// native_gemm.h (not included: its packed-weight constants share names with this file's).
const kernels::GemmKernels& gemm_kernels();

const DepthwiseKernel& depthwise_kernel() {
  static const DepthwiseKernel avx512{&kernels::depthwise_rows_avx512, &kernels::depthwise_scratch_bytes};
  static const DepthwiseKernel avx2{&kernels::depthwise_rows_avx2, &kernels::depthwise_scratch_bytes_avx2};
  TORCH_CHECK_VALUE(cpu::has(cpu::Isa::Avx2), "the native depthwise conv needs AVX2, which this CPU (or "
                    "QBACKEND_ISA) does not offer; use the onednn or fbgemm provider");
  return cpu::has(cpu::Isa::Avx512Vnni) && std::strcmp(gemm_kernels().name, "avx2") != 0 ? avx512 : avx2;
}

void bind_depthwise(kernels::DepthwiseArgs& a, const DepthwiseView& w) {
  a.w = w.w;
  a.w32 = w.w32;
  a.epi.N = a.C;
  a.epi.ldc = a.C;
  a.epi.colsum = w.colsum;
}

void run_depthwise(kernels::DepthwiseArgs& a, const DepthwiseView& w) {
  const DepthwiseKernel& k = depthwise_kernel();
  bind_depthwise(a, w);
  const size_t bytes = k.scratch_bytes(a);
  const int64_t rows = a.N * a.OH;
  const int64_t work = rows * a.OW * a.C * a.KH * a.KW;
  if (work < kParallelWork || at::get_num_threads() <= 1) {
    k.rows(a, 0, rows, scratch(bytes));
    return;
  }
  parallel::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) { k.rows(a, begin, end, scratch(bytes)); });
}

}  // namespace qbackend::native
