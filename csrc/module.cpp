// The Python module qbackend._C: the CPU probe and ISA cap. The ops register themselves with the
// torch dispatcher (TORCH_LIBRARY_FRAGMENT(qbackend, ...)) when this library is loaded.
#include <torch/csrc/utils/pybind.h>

#include <fbgemm/Fbgemm.h>
#include <fbgemm/Utils.h>

#include "cpu/bf16_speed.h"
#include "cpu/probe.h"
#include "providers/native_gemm.h"
#include "providers/native_winograd.h"
#include "runtime/activation_cache.h"
#include "runtime/decoder_layer.h"
#include "runtime/forward_plan.h"
#include "runtime/parallel.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace qbackend::ops {
const char* woq_kernel_name();     // csrc/ops/woq_ops.cpp
const char* woq_a8_kernel_name();  // csrc/ops/woq_ops.cpp
}

namespace {

pybind11::dict cpu_probe() {
  const auto& f = qbackend::cpu::probe();
  pybind11::dict d;
  d["vendor"] = f.vendor;
  d["model_name"] = f.model_name;
  auto put = [&](const char* name, const qbackend::cpu::Feature& x) {
    d[name] = pybind11::make_tuple(x.cpu, x.os);
  };
  put("avx2", f.avx2);
  put("fma", f.fma);
  put("avx512f", f.avx512f);
  put("avx512bw", f.avx512bw);
  put("avx512vl", f.avx512vl);
  put("avx512dq", f.avx512dq);
  put("avx512_vnni", f.avx512_vnni);
  put("avx_vnni", f.avx_vnni);
  put("avx512_bf16", f.avx512_bf16);
  put("amx_tile", f.amx_tile);
  put("amx_int8", f.amx_int8);
  put("amx_bf16", f.amx_bf16);
  d["l2_bytes"] = f.l2_bytes;
  return d;
}

std::string fbgemm_isa() {
  switch (fbgemm::fbgemmInstructionSet()) {
    case fbgemm::inst_set_t::avx2: return "avx2";
    case fbgemm::inst_set_t::avx512: return "avx512";
    case fbgemm::inst_set_t::avx512_ymm: return "avx512_ymm";
    case fbgemm::inst_set_t::avx512_vnni: return "avx512_vnni";
    case fbgemm::inst_set_t::avx512_vnni_ymm: return "avx512_vnni_ymm";
    default: return "other";
  }
}

// Caps our own kernels at `level` (see probe.h) and forces FBGEMM to the matching ISA, so that a
// QBACKEND_ISA override keeps every kernel honest. level < 0 removes our cap and gives FBGEMM back the
// ISA it chose before any cap (a cap lifted in the process must not leave FBGEMM forced: weights it
// packed for its own ISA would run on the capped one's kernels).
void set_isa_cap(int level, bool allow_avx_vnni) {
  using qbackend::cpu::has;
  using qbackend::cpu::Isa;
  static const fbgemm::inst_set_t fbgemm_own = fbgemm::fbgemmInstructionSet();  // first call: import, uncapped
  qbackend::cpu::set_isa_cap(level);
  qbackend::cpu::set_avx_vnni_allowed(allow_avx_vnni);
  if (level < 0) {
    fbgemm::fbgemmForceIsa(fbgemm_own);
    return;
  }
  if (has(Isa::Avx512Vnni)) fbgemm::fbgemmForceIsa(fbgemm::inst_set_t::avx512_vnni);
  else if (has(Isa::Avx512)) fbgemm::fbgemmForceIsa(fbgemm::inst_set_t::avx512);
  else fbgemm::fbgemmForceIsa(fbgemm::inst_set_t::avx2);
}

// Bytes of FBGEMM's packed B for a K x N weight (the fake prepack op's output size).
int64_t fbgemm_packed_b_size(int64_t K, int64_t N) {
  return fbgemm::PackBMatrix<int8_t>::packedBufferSize(static_cast<int>(K), static_cast<int>(N));
}

// Bytes of the native provider's packed weight for N x K (the fake prepack op's output size).
int64_t native_packed_size(int64_t N, int64_t K) { return qbackend::native::packed_bytes(N, K); }

// The native GEMM's ISA on this CPU (and QBACKEND_ISA cap), or "" where it has none.
// ("amx", "avx512_vnni", "avx2_vnni", "avx2", or the kernel a test chose with set_native_kernel).
std::string native_isa() { return qbackend::native::available() ? qbackend::native::gemm_kernels().name : ""; }

// Peak int8 rate of the native GEMM's instruction on `threads` threads: each runs `iters`
// iterations of independent dot products; returns int8 ops per second (2 per multiply-add).
double native_peak_ops(int64_t iters, int threads) {
  const auto& k = qbackend::native::gemm_kernels();
  double ops = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (threads <= 1) {
    ops = k.peak_loop(iters);
  } else {
    std::vector<double> per(threads, 0.0);
    at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) per[t] = k.peak_loop(iters);
    });
    for (double v : per) ops += v;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ops / s;
}

// For tests of the thread pool: runs qbackend's parallel_for over [0, n) and returns, per index, how
// many times it was visited, the number of distinct threads that ran chunks, and whether a
// parallel_for nested in a chunk ran serially on that thread (a single-chunk call is not a region:
// a loop nested in it may use the pool). Each chunk busy-waits work_us; one
// containing `throw_at` throws.
pybind11::dict parallel_probe(int64_t n, int64_t grain, int64_t throw_at, double work_us) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::mutex mu;
  std::vector<std::thread::id> ids;
  std::atomic<bool> nested_serial{true};
  {
  pybind11::gil_scoped_release no_gil;
  qbackend::parallel::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (std::find(ids.begin(), ids.end(), std::this_thread::get_id()) == ids.end())
        ids.push_back(std::this_thread::get_id());
    }
    const auto me = std::this_thread::get_id();
    qbackend::parallel::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != me) nested_serial = false;
    });
    for (int64_t i = b; i < e; ++i) visits[size_t(i)].fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(work_us);
    while (std::chrono::steady_clock::now() < until) {
    }
    if (throw_at >= b && throw_at < e) throw std::runtime_error("chunk failed on purpose");
  });
  }
  pybind11::list counts;
  for (auto& v : visits) counts.append(v.load());
  pybind11::dict d;
  d["visits"] = counts;
  d["threads"] = ids.size();
  d["nested_serial"] = nested_serial.load();
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "qbackend C++ extension: CPU probe, ISA cap; ops live in torch.ops.qbackend";
  m.def("parallel_probe", &parallel_probe, "test hook of the thread pool (see module.cpp)",
        pybind11::arg("n"), pybind11::arg("grain"), pybind11::arg("throw_at") = -1,
        pybind11::arg("work_us") = 0.0);
  m.def("activation_cache_bytes", &qbackend::runtime::cached_bytes,
        "bytes of freed large op outputs qbackend keeps for reuse (runtime/activation_cache.h)");
  m.def("activation_cache_limit", &qbackend::runtime::cache_limit, "the most bytes it keeps");
  m.def("set_activation_cache_limit", &qbackend::runtime::set_cache_limit, py::arg("bytes"),
        "set it (QBACKEND_ACTIVATION_CACHE_MB at load; 0 turns the cache off); frees every kept block "
        "when more than the new limit is kept");
  m.def("release_activation_cache", &qbackend::runtime::release_cached, "free every kept block");
  m.def("spin_us", &qbackend::parallel::spin_us, "microseconds qbackend's pool threads spin before sleeping");
  m.def("set_spin_us", &qbackend::parallel::set_spin_us, "set them (QBACKEND_SPIN_US at load; 0 = no spinning)");
  m.def("own_pool", &qbackend::parallel::own_pool, "whether qbackend's kernels run on its own pool (else OpenMP)");
  m.def("set_own_pool", &qbackend::parallel::set_own_pool, "choose it (QBACKEND_THREADING at load)");
  m.def("cpu_probe", &cpu_probe, "CPUID/XGETBV probe: {feature: (cpu_has, os_allows)}, vendor, model_name, l2_bytes (per core, 0: unknown)");
  py::enum_<qbackend::cpu::Isa>(m, "Isa", "the ISA levels of qbackend's kernels (qbackend.core.isa.Isa)")
      .value("SCALAR", qbackend::cpu::Isa::Scalar)
      .value("AVX2", qbackend::cpu::Isa::Avx2)
      .value("AVX512", qbackend::cpu::Isa::Avx512)
      .value("AVX512_VNNI", qbackend::cpu::Isa::Avx512Vnni)
      .value("AMX", qbackend::cpu::Isa::Amx);
  m.def("usable_isa", &qbackend::cpu::usable_isa, "the ISA level our kernels use (after QBACKEND_ISA)");
  m.def("set_isa_cap", &set_isa_cap, "cap our kernels and FBGEMM at an ISA level (-1 = none)",
        pybind11::arg("level"), pybind11::arg("allow_avx_vnni") = true);
  m.def("avx_vnni_usable", &qbackend::cpu::avx_vnni_usable);
  m.def("bf16_usable", &qbackend::cpu::bf16_usable);
  m.def("bf16_products_pay", &qbackend::cpu::bf16_products_pay,
        "whether bf16 dot products beat fp32 FMAs here (measured once; see bf16_products_policy)");
  m.def("fma_gflops", &qbackend::cpu::fma_gflops, "GFLOP/s of an fp32 FMA loop on this thread (measured now)");
  m.def("bf16_dot_gflops", &qbackend::cpu::bf16_dot_gflops,
        "GFLOP/s of a bf16 dot-product loop on this thread (measured now; 0 without AVX512-BF16)");
  m.def("set_bf16_products_policy", &qbackend::cpu::set_bf16_products_policy, py::arg("policy"),
        "'auto' (measured), 'on' (wherever AVX512-BF16 runs: tests), 'off'");
  m.def("bf16_products_policy", &qbackend::cpu::bf16_products_policy);
  m.def("isa_cap", &qbackend::cpu::isa_cap);
  m.def("fbgemm_isa", &fbgemm_isa, "the instruction set FBGEMM dispatches to");
  m.def("native_packed_size", &native_packed_size, "bytes of the native provider's packed N x K weight");
  m.def("native_conv_gemm_k", &qbackend::native::conv_gemm_k, py::arg("in_channels"), py::arg("kh"), py::arg("kw"),
        "the K of the native provider's GEMM weight for a conv (kh * kw * in_channels, or more: zero columns that "
        "let the AMX tiles cover every k)");
  m.def("native_kernel_for", &qbackend::native::kernel_for, py::arg("packed"),
        "the native kernel's name for GEMMs on this packed weight (a Linear's or a conv's)");
  m.def("native_isa", &native_isa, "the native GEMM's instruction set here, or '' where it has none");
  m.def("woq_isa", [] { return std::string(qbackend::ops::woq_kernel_name()); },
        "the instruction set of the weight-only int8 kernels in use (avx512, avx2 or scalar)");
  m.def("woq_a8_isa", [] { return std::string(qbackend::ops::woq_a8_kernel_name()); },
        "the instruction set of the int4-weight, int8-activation kernels in use (avx512_vnni, avx2 or scalar)");
  m.def("set_native_kernel", &qbackend::native::set_kernel_override, py::arg("name"),
        "tests: run the native GEMM on the named kernel (amx, amx_emulated: the AMX kernel over emulated tiles, "
        "avx512_vnni, avx2_vnni, avx2_vnni_evex: the AVX-VNNI kernel's code on EVEX, avx2: int16 products), '' = "
        "this CPU's choice");
  m.def("set_native_rows_read_ahead", &qbackend::kernels::set_rows_read_ahead, py::arg("enabled"),
        "tests and benchmarks: whether the AVX512-VNNI GEMM reads the next row tile's activations ahead where "
        "they come from L3 or memory (the same output bytes either way); True by default");
  m.def("set_native_direct_conv", &qbackend::native::set_direct_conv, py::arg("enabled"),
        "tests and benchmarks: whether KxK convs of stride 1 or 2 over a multiple of 64 channels use the native kernel's "
        "direct convolution (AMX) instead of gathered taps; True by default");
  m.def("native_direct_conv_calls", &qbackend::native::direct_conv_calls,
        "how many native conv calls ran on the direct convolution in this process");
  m.def("native_amx_self_check", &qbackend::kernels::gemm_amx_self_check, py::arg("emulated"),
        "compares the AMX kernel (or the emulated one) with the VNNI kernel and exact sums: '' or the difference");
  m.def("set_native_winograd", &qbackend::native::set_winograd, py::arg("enabled"),
        "whether 3x3 stride-1 convs pack and run on the Winograd route where it applies (AVX2 without VNNI)");
  m.def("native_winograd_enabled", &qbackend::native::winograd_enabled);
  m.def("native_winograd_calls", &qbackend::native::winograd_calls, "conv calls that ran on the Winograd route");
  m.def("native_peak_ops", &native_peak_ops, "int8 ops/s of a dot-product loop on `threads` threads",
        pybind11::arg("iters"), pybind11::arg("threads") = 1);
  qbackend::register_forward_plan(m);
  qbackend::register_decoder_layer(m);
  m.def("fbgemm_packed_b_size", &fbgemm_packed_b_size, "bytes of FBGEMM's packed B for a K x N weight");
}
