// CPUID / XGETBV probe and the ISA cap that QBACKEND_ISA sets. No torch headers: plain C++.
#include "cpu/probe.h"

#include <atomic>
#include <cpuid.h>
#include <cstdint>
#include <cstring>
#include <mutex>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qbackend::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// Linux: AMX tile data is off until the process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int ARCH_GET_XCOMP_PERM = 0x1022;
  constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
  constexpr int XFEATURE_XTILEDATA = 18;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) != 0) return false;
  return (bitmask >> XFEATURE_XTILEDATA) & 1ul;
#else
  return false;
#endif
}

Features do_probe() {
  Features f;
  Regs v = cpuid(0);
  char vendor[13] = {0};
  std::memcpy(vendor + 0, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  const unsigned max_leaf = v.a;

  Regs ext = cpuid(0x80000000u);
  if (ext.a >= 0x80000004u) {
    char name[49] = {0};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002u + i);
      std::memcpy(name + 16 * i + 0, &r.a, 4);
      std::memcpy(name + 16 * i + 4, &r.b, 4);
      std::memcpy(name + 16 * i + 8, &r.c, 4);
      std::memcpy(name + 16 * i + 12, &r.d, 4);
    }
    std::string s(name);
    const auto first = s.find_first_not_of(' ');
    const auto last = s.find_last_not_of(' ');
    f.model_name = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  }
  // L2 size per core: leaf 0x80000006 ECX[31:16] in KB (AMD and Intel alike).
  if (ext.a >= 0x80000006u) f.l2_bytes = static_cast<int64_t>(cpuid(0x80000006u).c >> 16) << 10;

  Regs l1 = cpuid(1);
  const bool osxsave = bit(l1.c, 27);
  f.fma.cpu = bit(l1.c, 12);
  Regs l7, l7s1;
  if (max_leaf >= 7) {
    l7 = cpuid(7, 0);
    l7s1 = cpuid(7, 1);
  }
  f.avx2.cpu = bit(l7.b, 5);
  f.avx512f.cpu = bit(l7.b, 16);
  f.avx512dq.cpu = bit(l7.b, 17);
  f.avx512bw.cpu = bit(l7.b, 30);
  f.avx512vl.cpu = bit(l7.b, 31);
  f.avx512_vnni.cpu = bit(l7.c, 11);
  f.amx_bf16.cpu = bit(l7.d, 22);
  f.amx_tile.cpu = bit(l7.d, 24);
  f.amx_int8.cpu = bit(l7.d, 25);
  f.avx_vnni.cpu = bit(l7s1.a, 4);
  f.avx512_bf16.cpu = bit(l7s1.a, 5);

  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6;             // SSE + AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;    // opmask + ZMM_Hi256 + Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;   // XTILECFG + XTILEDATA
  for (Feature* x : {&f.avx2, &f.fma, &f.avx_vnni}) x->os = x->cpu && ymm;
  for (Feature* x : {&f.avx512f, &f.avx512bw, &f.avx512vl, &f.avx512dq, &f.avx512_vnni, &f.avx512_bf16})
    x->os = x->cpu && zmm;
  const bool any_amx = f.amx_tile.cpu || f.amx_int8.cpu || f.amx_bf16.cpu;
  const bool amx_ok = any_amx && tiles && request_amx_permission();
  for (Feature* x : {&f.amx_tile, &f.amx_int8, &f.amx_bf16}) x->os = x->cpu && amx_ok;
  return f;
}

std::atomic<int> g_cap{-1};
std::atomic<bool> g_avx_vnni_allowed{true};

}  // namespace

const Features& probe() {
  static const Features features = do_probe();
  return features;
}

Isa usable_isa() {
  const Features& f = probe();
  Isa level = Isa::Scalar;
  if (f.avx2.os && f.fma.os) level = Isa::Avx2;
  if (level == Isa::Avx2 && f.avx512f.os && f.avx512bw.os && f.avx512vl.os && f.avx512dq.os) level = Isa::Avx512;
  if (level == Isa::Avx512 && f.avx512_vnni.os) level = Isa::Avx512Vnni;
  if (level == Isa::Avx512Vnni && f.amx_tile.os && f.amx_int8.os) level = Isa::Amx;
  const int cap = g_cap.load(std::memory_order_relaxed);
  return cap >= 0 && cap < static_cast<int>(level) ? static_cast<Isa>(cap) : level;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Vnni: return "avx512_vnni";
    case Isa::Amx: return "amx";
  }
  return "?";
}

void set_isa_cap(int cap) { g_cap.store(cap, std::memory_order_relaxed); }
int isa_cap() { return g_cap.load(std::memory_order_relaxed); }

bool avx_vnni_usable() { return g_avx_vnni_allowed.load() && probe().avx_vnni.os && has(Isa::Avx2); }
bool bf16_usable() { return probe().avx512_bf16.os && has(Isa::Avx512Vnni); }
void set_avx_vnni_allowed(bool allowed) { g_avx_vnni_allowed.store(allowed); }

}  // namespace qbackend::cpu
