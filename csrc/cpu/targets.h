// The instruction sets each ISA-specific translation unit is compiled for, in one place. A kernel
// unit includes its standard headers, then this one, then switches its target with QB_TARGET and
// includes <immintrin.h> and its kernel headers after it; the caller picks the unit at run time by
// cpu::usable_isa() (probe.h), so the build itself stays portable (no -march flag).
#pragma once

// The level of each cpu::Isa, as GCC target features. QB_ISA_AVX512 leaves out the "fma" feature,
// but AVX512F has its own (EVEX) fused multiply-adds and GCC contracts a product and a sum into one
// under avx512f alone, for 512-bit, 256-bit and scalar values: a unit whose float steps must stay
// apart (every ISA writing the same bits) also sets fp-contract=off (gptq_avx2.cpp, gptq_avx512.cpp).
#define QB_ISA_AVX2 "avx2,fma"
#define QB_ISA_AVX2_NO_FMA "avx2"  // for units whose float steps must not fuse (GPTQ's column loop)
#define QB_ISA_AVX512 "avx512f,avx512bw,avx512vl,avx512dq"
#define QB_ISA_AVX512_FMA QB_ISA_AVX512 ",avx2,fma"
#define QB_ISA_AVX512_VNNI QB_ISA_AVX512_FMA ",avx512vnni"
#define QB_ISA_AMX QB_ISA_AVX512_VNNI ",amx-tile,amx-int8"
// Extensions a unit adds to its level.
#define QB_ISA_AVX_VNNI ",avxvnni"  // VEX-encoded u8 x s8 dot products (AVX2-class CPUs; cpu::avx_vnni_usable)
#define QB_ISA_VNNI_YMM ",avx512f,avx512vl,avx512vnni"  // their EVEX form on 256-bit registers (AVX512-VNNI CPUs)
#define QB_ISA_BF16 ",avx512bf16"   // AVX512-BF16 (cpu::bf16_usable)
#define QB_ISA_F16C ",f16c"         // every AVX2 CPU has it
#define QB_ISA_POPCNT ",popcnt"     // every AVX2 CPU has it

#define QB_PRAGMA(x) _Pragma(#x)
// QB_TARGET(QB_ISA_AVX512 QB_ISA_POPCNT): compile the rest of the unit for these features.
#define QB_TARGET(features) QB_PRAGMA(GCC target(features))
