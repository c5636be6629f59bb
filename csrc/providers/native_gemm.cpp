// The native provider's packed weight, kernel choice and thread split (native_gemm.h).
#include "providers/native_gemm.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/probe.h"
#include "kernels/winograd_kernels.h"
#include "runtime/parallel.h"

namespace qbackend::native {
namespace {

constexpr char kMagic[8] = {'Q', 'B', 'N', 'G', 'E', 'M', 'M', '1'};
// Products of M * N * K from which the second thread is used (below, a fork/join costs more than
// it saves): MobileNetV2's 144 -> 32 @28 (3.6M) and 192 -> 64 @14 (2.4M) 1x1 convs took 9.5 and
// 7.1 us on one thread, 6.4 and 4.9 us on two, in the model (Zen 5, torch.profiler, batch 1).
constexpr int64_t kParallelWork = int64_t(1) << 21;
// Weights from this many bytes are split over the threads even for a few rows: those GEMMs are
// bound by reading the weight, and each core brings its own bandwidth (768 x 3072 at M = 1).
constexpr int64_t kParallelWeightBytes = int64_t(1) << 19;

}  // namespace

int64_t packed_bytes(int64_t N, int64_t K) {
  const int64_t Np = kernels::gemm_np(N);
  return kHeaderBytes + 4 * Np + Np * kernels::gemm_kp(K);
}

namespace {

// Where a packed weight's Winograd filter starts: the first multiple of 64 bytes past the panels.
int64_t winograd_offset(int64_t N, int64_t Kg) { return (packed_bytes(N, Kg) + 63) / 64 * 64; }

// Bytes of a packed weight with the Winograd filter of C input channels after it (winograd = true).
int64_t conv_packed_bytes(int64_t N, int64_t Kg, int64_t C, bool winograd) {
  return winograd ? winograd_offset(N, Kg) + 2 * kernels::winograd_packed_elems(N, C) : packed_bytes(N, Kg);
}

// Writes the header and packs w [N, Kg] into p (K: the weight's own K, Kg > K: zero columns past it).
void pack_into(uint8_t* p, const at::Tensor& w2d, int64_t K, int64_t KH, int64_t KW) {
  const int64_t N = w2d.size(0), Kg = w2d.size(1);
  const int64_t kg_field = Kg == K ? 0 : Kg;
  std::memset(p, 0, kHeaderBytes);
  std::memcpy(p, kMagic, 8);
  std::memcpy(p + 8, &N, 8);
  std::memcpy(p + 16, &K, 8);
  std::memcpy(p + 24, &KH, 8);
  std::memcpy(p + 32, &KW, 8);
  std::memcpy(p + 40, &kg_field, 8);
  const int8_t* w = w2d.const_data_ptr<int8_t>();
  int64_t w7 = 1;
  for (int64_t i = 0, n = N * Kg; i < n && w7; ++i) w7 = w[i] >= -64 && w[i] <= 64;
  std::memcpy(p + 48, &w7, 8);
  const int64_t Np = kernels::gemm_np(N);
  kernels::gemm_pack_b(w2d.const_data_ptr<int8_t>(), N, Kg, reinterpret_cast<int8_t*>(p + kHeaderBytes + 4 * Np),
                       reinterpret_cast<int32_t*>(p + kHeaderBytes));
}

void check_gemm_size(int64_t N, int64_t K, const char* what) {
  checks::int32_reduction(K, what);
  TORCH_CHECK_VALUE(N < (int64_t(1) << 24), "the native provider takes out_features < 2**24, got ", N);
}

// The header's fields and the checks every packed tensor passes.
PackedView read_header(const at::Tensor& packed, const char* name) {
  TORCH_CHECK_VALUE(packed.defined() && packed.device().is_cpu() && packed.layout() == at::kStrided &&
                        packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() >= kHeaderBytes,
                    name, " is not a native packed weight (expected the uint8 tensor native_linear_prepack or "
                    "native_conv2d_prepack returns)");
  const uint8_t* p = packed.const_data_ptr<uint8_t>();
  PackedView v;
  int64_t kh = 0, kw = 0, kg = 0, w7 = 0, wino = 0;
  std::memcpy(&v.N, p + 8, 8);
  std::memcpy(&v.K, p + 16, 8);
  std::memcpy(&kh, p + 24, 8);
  std::memcpy(&kw, p + 32, 8);
  std::memcpy(&kg, p + 40, 8);
  std::memcpy(&w7, p + 48, 8);
  std::memcpy(&wino, p + 56, 8);
  TORCH_CHECK_VALUE((w7 == 0 || w7 == 1) && std::memcmp(p, kMagic, 8) == 0 && v.N > 0 && v.K > 0 && v.K <= 65536 &&
                        (wino == 0 || (wino == 1 && kh == 3 && kw == 3 && kg == 0 &&
                                       v.K / 9 <= kernels::kWinogradMaxChannels)) &&
                        v.N < (int64_t(1) << 24) && kh >= 0 && kw >= 0 && kh <= 64 && kw <= 64 && (kh == 0) == (kw == 0) &&
                        (kg == 0 || (kg > v.K && kg <= 65536)),
                    name, " is not a native packed weight (its header does not match)");
  v.Kg = kg ? kg : v.K;
  v.w7 = w7 == 1;
  v.KH = kh ? kh : 1;
  v.KW = kw ? kw : 1;
  v.colsum = reinterpret_cast<const int32_t*>(p + kHeaderBytes);
  v.panels = reinterpret_cast<const int8_t*>(p + kHeaderBytes + 4 * kernels::gemm_np(v.N));
  // (inside the tensor once unpack_conv has checked its size)
  if (wino) v.winograd = reinterpret_cast<const int16_t*>(p + winograd_offset(v.N, v.Kg));
  return v;
}

}  // namespace

at::Tensor pack(const at::Tensor& w2d) {
  check_gemm_size(w2d.size(0), w2d.size(1), "in_features");
  at::Tensor out = at::empty({packed_bytes(w2d.size(0), w2d.size(1))}, at::kByte);
  pack_into(out.data_ptr<uint8_t>(), w2d, w2d.size(1), 0, 0);
  return out;
}

// Padded where the zero columns cost less than the VNNI tail they replace: the AMX Xeon, 2 threads,
// the 7x7 ImageNet stem (K 147 -> 192) 205 -> 174 us at batch 1 and 7.4 -> 5.9 ms at batch 32; 3x3
// stems over 3 channels (27 -> 64) 0.95-1.5x; the 1-channel digits stem (9 -> 64) 0.8x, so not
// beyond 2.5 K.
int64_t conv_gemm_k(int64_t C, int64_t KH, int64_t KW) {
  const int64_t K = KH * KW * C, Kg = (K + 63) / 64 * 64;
  const bool tiles = available() && std::string(gemm_kernels().name).rfind("amx", 0) == 0;
  return tiles && KH * KW > 1 && C < 16 && Kg != K && 2 * Kg <= 5 * K ? Kg : K;
}

at::Tensor pack_conv(const at::Tensor& weight, bool winograd) {
  const int64_t OC = weight.size(0), C = weight.size(1), KH = weight.size(2), KW = weight.size(3);
  TORCH_CHECK_VALUE(KH <= 64 && KW <= 64, "the native provider takes kernels up to 64 x 64, got ", KH, "x", KW);
  check_gemm_size(OC, KH * KW * C, "in_channels x kH x kW");
  const int64_t K = KH * KW * C, taps = KH * KW, Kg = conv_gemm_k(C, KH, KW);
  at::Tensor w2d = weight.permute({0, 2, 3, 1}).reshape({OC, K});
  if (Kg != K) w2d = at::constant_pad_nd(w2d, {0, Kg - K}, 0);
  w2d = w2d.contiguous();
  winograd = winograd && KH == 3 && KW == 3 && Kg == K && C <= kernels::kWinogradMaxChannels;
  const int64_t bytes = conv_packed_bytes(OC, Kg, C, winograd);
  at::Tensor out = at::zeros({KH, KW, (bytes + taps - 1) / taps}, at::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  pack_into(p, w2d, K, KH, KW);
  if (winograd) {
    const int64_t one = 1;
    std::memcpy(p + 56, &one, 8);
    const at::Tensor w = weight.contiguous();
    kernels::winograd_pack(w.const_data_ptr<int8_t>(), OC, C,
                           reinterpret_cast<int16_t*>(p + winograd_offset(OC, Kg)));
  }
  return out;
}

uint8_t* conv_scratch(int64_t bytes) {
  static thread_local std::vector<uint8_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < bytes + 64) buffer.resize(static_cast<size_t>(bytes + 64));
  const auto p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

PackedView unpack(const at::Tensor& packed, const char* name) {
  TORCH_CHECK_VALUE(packed.defined() && packed.dim() == 1, name, " is not a native packed weight for a Linear "
                    "(expected the 1-D uint8 tensor native_linear_prepack returns)");
  const PackedView v = read_header(packed, name);
  TORCH_CHECK_VALUE(packed.numel() == packed_bytes(v.N, v.K) && v.KH == 1 && v.KW == 1 && v.Kg == v.K && !v.winograd,
                    name, " is not a native packed weight for a Linear (its header or size does not match)");
  return v;
}

PackedView unpack_conv(const at::Tensor& packed, const char* name) {
  TORCH_CHECK_VALUE(packed.defined() && (packed.dim() == 1 || packed.dim() == 3), name, " is not a native packed "
                    "weight for a conv (expected the [kH, kW, L] uint8 tensor native_conv2d_prepack returns)");
  const PackedView v = read_header(packed, name);
  const int64_t taps = v.KH * v.KW, bytes = conv_packed_bytes(v.N, v.Kg, v.K / taps, v.winograd != nullptr);
  const bool ok = packed.dim() == 1 ? packed.numel() == bytes && taps == 1 && v.Kg == v.K  // a 1x1 weight of earlier versions
                                    : packed.size(0) == v.KH && packed.size(1) == v.KW &&
                                          packed.size(2) == (bytes + taps - 1) / taps && v.K % taps == 0;
  TORCH_CHECK_VALUE(ok, name, " is not a native packed weight for a conv (its header, shape or size does not match)");
  return v;
}

namespace {

// A kernel chosen by a test (set_kernel_override), or nullptr.
std::atomic<const kernels::GemmKernels*> g_override{nullptr};
// A test chose "avx2_int16": the AVX2 kernel's int16 products on 7-bit weights too.
std::atomic<bool> g_int16_only{false};

// The AMX kernel is used only after it agreed with the VNNI kernel and exact sums on this machine
// (kernels::gemm_amx_self_check, once per process): a CPU or OS where it computes anything else
// gets the VNNI kernel and a warning, never a wrong result.
bool amx_verified() {
  static const bool ok = [] {
    const std::string diff = kernels::gemm_amx_self_check(false);
    if (!diff.empty())
      TORCH_WARN("qbackend: the native AMX int8 GEMM disagreed with its VNNI kernel on this machine (", diff,
                 "); the native provider uses the AVX512-VNNI kernel instead. Please report this.");
    return diff.empty();
  }();
  return ok;
}

}  // namespace

bool available() { return cpu::has(cpu::Isa::Avx2); }

const kernels::GemmKernels& gemm_kernels() {
  TORCH_CHECK_VALUE(available(),
                    "the native int8 GEMM needs AVX2, which this CPU (or QBACKEND_ISA) does not offer; use the "
                    "fbgemm or onednn provider");
  if (const auto* k = g_override.load(std::memory_order_relaxed)) return *k;
  if (cpu::has(cpu::Isa::Amx) && amx_verified()) return kernels::gemm_kernels_amx();
  if (cpu::has(cpu::Isa::Avx512Vnni)) return kernels::gemm_kernels_avx512_vnni();
  if (cpu::avx_vnni_usable()) return kernels::gemm_kernels_avx2_vnni();
  return kernels::gemm_kernels_avx2();
}

void set_kernel_override(const std::string& name) {
  using cpu::Isa;
  const kernels::GemmKernels* k = nullptr;
  if (name == "amx" && cpu::has(Isa::Amx)) k = &kernels::gemm_kernels_amx();
  else if (name == "amx_emulated" && cpu::has(Isa::Avx512Vnni)) k = &kernels::gemm_kernels_amx_emulated();
  else if (name == "avx512_vnni" && cpu::has(Isa::Avx512Vnni)) k = &kernels::gemm_kernels_avx512_vnni();
  else if (name == "avx2_vnni" && cpu::avx_vnni_usable()) k = &kernels::gemm_kernels_avx2_vnni();
  else if ((name == "avx2" || name == "avx2_int16") && cpu::has(Isa::Avx2)) k = &kernels::gemm_kernels_avx2();
  else if (name == "avx2_vnni_evex" && cpu::has(Isa::Avx512Vnni)) k = &kernels::gemm_kernels_avx2_vnni_evex();
  else TORCH_CHECK_VALUE(name.empty(), "no native kernel '", name, "' runs on this CPU (or under QBACKEND_ISA)");
  g_override.store(k, std::memory_order_relaxed);
  g_int16_only.store(name == "avx2_int16", std::memory_order_relaxed);
}

const kernels::GemmKernels& gemm_kernels(const kernels::GemmArgs& g) {
  const auto& k = gemm_kernels();
  if (g.b_7bit && &k == &kernels::gemm_kernels_avx2() && !g_int16_only.load(std::memory_order_relaxed))
    return kernels::gemm_kernels_avx2_pairs();
  return k;
}

std::string kernel_for(const at::Tensor& packed) {
  const PackedView v = read_header(packed, "packed");
  kernels::GemmArgs g;
  g.b_7bit = v.w7;
  return gemm_kernels(g).name;
}

void run(const kernels::GemmArgs& g) {
  const auto& k = gemm_kernels(g);
  const int64_t panels = kernels::gemm_num_panels(g.N);
  const bool big = g.M * g.N * g.K >= kParallelWork || (g.N * g.K >= kParallelWeightBytes && panels >= 2);
  const int threads = big ? at::get_num_threads() : 1;
  if (threads <= 1 || g.M == 0) {
    k.gemm(g, 0, g.M, 0, panels);
    return;
  }
  // Split the larger operand: columns (each thread reads all of x and its share of the weight)
  // when the weight is larger than x or there are too few rows, else rows in multiples of the
  // kernel's row tile (each thread reads all of the weight).
  const int64_t rt = k.row_tile;
  const bool by_panels = (g.N > g.M && panels >= threads) || g.M < 2 * rt * threads;
  parallel::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (by_panels) {
        k.gemm(g, 0, g.M, panels * t / threads, panels * (t + 1) / threads);
      } else {
        const int64_t tiles = (g.M + rt - 1) / rt;
        k.gemm(g, std::min(g.M, tiles * t / threads * rt), std::min(g.M, tiles * (t + 1) / threads * rt), 0, panels);
      }
    }
  });
}

kernels::GemmArgs gemm_args(const PackedView& w, at::ScalarType x_dtype, int64_t x_zero_point, double x_scale,
                            const at::Tensor& w_scales, const at::Tensor& bias, checks::PostOp op,
                            at::ScalarType output_dtype, double output_scale, int64_t output_zero_point) {
  using kernels::GemmOut;
  using kernels::GemmPost;
  kernels::GemmArgs g;
  g.N = w.N;
  g.K = w.Kg;
  g.a_int8 = x_dtype == at::kChar;
  g.a_zp = static_cast<int32_t>(x_zero_point) + (g.a_int8 ? 128 : 0);
  g.b = w.panels;
  g.b_7bit = w.w7;
  g.colsum = w.colsum;
  g.w_scales = w_scales.const_data_ptr<float>();
  g.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  g.x_scale = static_cast<float>(x_scale);
  g.post = op == checks::PostOp::relu ? GemmPost::relu : op == checks::PostOp::gelu ? GemmPost::gelu : GemmPost::none;
  switch (output_dtype) {
    case at::kByte: g.out_type = GemmOut::u8; break;
    case at::kChar: g.out_type = GemmOut::s8; break;
    case at::kBFloat16: g.out_type = GemmOut::bf16; break;
    default: g.out_type = GemmOut::f32;
  }
  g.ldc = w.N;
  if (checks::is_int8_type(output_dtype)) {
    g.out_inv_scale = 1.0f / static_cast<float>(output_scale);
    g.out_zp = static_cast<int32_t>(output_zero_point);
  }
  return g;
}

}  // namespace qbackend::native
