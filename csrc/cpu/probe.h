// CPU feature probe: what the CPU has (CPUID) and what the OS lets us use (XCR0, AMX permission).
#pragma once
#include <cstdint>
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
  int64_t l2_bytes = 0;  // the L2 cache per core (CPUID), 0 where the CPU does not say
};

// Probes once (thread-safe) and caches. Requests AMX tile-data permission from Linux on first call.
const Features& probe();

// The ISA levels of qbackend's own kernels, ordered: each implies the ones below. Python mirrors
// them (qbackend.core.isa.Isa, checked against _C.Isa by the tests).
enum class Isa : int {
  Scalar = 0,
  Avx2 = 1,        // AVX2 + FMA
  Avx512 = 2,      // AVX512 F, BW, VL, DQ
  Avx512Vnni = 3,  // + AVX512-VNNI
  Amx = 4,         // + AMX tiles and AMX-INT8, the OS's tile-data permission granted
};

// The level our own kernels may use: the lower of what the probe found usable and the cap.
Isa usable_isa();
// Whether the level in use is `isa` or above (the named predicate every kernel choice uses).
inline bool has(Isa isa) { return static_cast<int>(usable_isa()) >= static_cast<int>(isa); }
const char* isa_name(Isa isa);
void set_isa_cap(int cap);  // called once from Python (QBACKEND_ISA); -1 = no cap
int isa_cap();
// AVX-VNNI (the VEX-encoded u8 x s8 dot product of AVX2-class CPUs) may be used by oneDNN: true
// unless QBACKEND_ISA capped below it (avx2, avx512), and the CPU and OS have it.
bool avx_vnni_usable();
// AVX512-BF16 (vdpbf16ps, vcvtneps2bf16): the CPU and OS have it and QBACKEND_ISA does not cap
// below avx512_vnni (the level of the CPUs that have it).
bool bf16_usable();
void set_avx_vnni_allowed(bool allowed);

}  // namespace qbackend::cpu
