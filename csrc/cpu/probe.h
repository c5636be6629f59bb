// CPU feature probe: what the CPU has (CPUID) and what the OS lets us use (XCR0, AMX permission).
#pragma once
#include <string>

namespace qbackend::cpu {

struct Feature {
  bool cpu = false;  // the CPU reports it (CPUID)
  bool os = false;   // the OS saves the register state it needs (XCR0) and, for AMX, granted permission
};

struct Features {
  std::string vendor;
  std::string model_name;
  Feature avx2, fma, avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni, avx_vnni, avx512_bf16,
      amx_tile, amx_int8, amx_bf16;
};

// Probes once (thread-safe) and caches. Requests AMX tile-data permission from Linux on first call.
const Features& probe();

// The ISA level our own kernels may use: 0 = scalar, 1 = AVX2, 2 = AVX512 (F+BW+VL+DQ),
// 3 = AVX512-VNNI, 4 = AMX. It is the lower of what the probe found usable and the cap.
int usable_level();
void set_level_cap(int cap);  // called once from Python (QBACKEND_ISA); -1 = no cap
int level_cap();
// AVX-VNNI (the VEX-encoded u8 x s8 dot product of AVX2-class CPUs) may be used by oneDNN: true
// unless QBACKEND_ISA capped below it (avx2, avx512), and the CPU and OS have it.
bool avx_vnni_usable();
// AVX512-BF16 (vdpbf16ps, vcvtneps2bf16): the CPU and OS have it and QBACKEND_ISA does not cap
// below avx512_vnni (the level of the CPUs that have it).
bool bf16_usable();
void set_avx_vnni_allowed(bool allowed);

}  // namespace qbackend::cpu
