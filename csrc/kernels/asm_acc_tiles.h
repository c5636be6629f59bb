// Assembly text shared by the 256-bit kernels' K loops with 10 or 12 accumulators in ymm0-9 / ymm0-11,
// row r's two 8-column halves in 2r and 2r + 1 (gemm_avx2.cpp's int16 tile and winograd_avx2.cpp's:
// 12; gemm_avx2_pairs.cpp's pair-product tile: 10). QB_ASM_ZERO_ACCn clears them; QB_ASM_LOOP_OPEN(N)
// opens the loop over the count operand N ("%[n]"; none when it is 0) at label 1 and
// QB_ASM_LOOP_CLOSE(N) closes it (label 2 after it); QB_ASM_STORE_ACCn(OUT) stores them to the bytes
// at the operand OUT ("%[out]"), row r at 64 r. QB_ASM_LOOP_BEGIN_ACC12 / QB_ASM_LOOP_END_ACC12 put
// the 12-accumulator loop's pieces together. A plain header of string macros: no code, no target.
#pragma once

#define QB_ASM_ZERO_ACC10                                                  \
  "vpxor %%xmm0, %%xmm0, %%xmm0\n\t vpxor %%xmm1, %%xmm1, %%xmm1\n\t"       \
  "vpxor %%xmm2, %%xmm2, %%xmm2\n\t vpxor %%xmm3, %%xmm3, %%xmm3\n\t"       \
  "vpxor %%xmm4, %%xmm4, %%xmm4\n\t vpxor %%xmm5, %%xmm5, %%xmm5\n\t"       \
  "vpxor %%xmm6, %%xmm6, %%xmm6\n\t vpxor %%xmm7, %%xmm7, %%xmm7\n\t"       \
  "vpxor %%xmm8, %%xmm8, %%xmm8\n\t vpxor %%xmm9, %%xmm9, %%xmm9\n\t"

#define QB_ASM_ZERO_ACC12 \
  QB_ASM_ZERO_ACC10       \
  "vpxor %%xmm10, %%xmm10, %%xmm10\n\t vpxor %%xmm11, %%xmm11, %%xmm11\n\t"

#define QB_ASM_LOOP_OPEN(N)      \
  "test " N ", " N "\n\t"        \
  "jle 2f\n\t"                   \
  ".p2align 4\n"                 \
  "1:\n\t"

#define QB_ASM_LOOP_CLOSE(N) \
  "dec " N "\n\t"            \
  "jnz 1b\n"                 \
  "2:\n\t"

#define QB_ASM_STORE_ACC10(OUT)                                                          \
  "vmovdqu %%ymm0, 0(" OUT ")\n\t vmovdqu %%ymm1, 32(" OUT ")\n\t"                        \
  "vmovdqu %%ymm2, 64(" OUT ")\n\t vmovdqu %%ymm3, 96(" OUT ")\n\t"                       \
  "vmovdqu %%ymm4, 128(" OUT ")\n\t vmovdqu %%ymm5, 160(" OUT ")\n\t"                     \
  "vmovdqu %%ymm6, 192(" OUT ")\n\t vmovdqu %%ymm7, 224(" OUT ")\n\t"                     \
  "vmovdqu %%ymm8, 256(" OUT ")\n\t vmovdqu %%ymm9, 288(" OUT ")\n\t"

#define QB_ASM_STORE_ACC12(OUT) \
  QB_ASM_STORE_ACC10(OUT)       \
  "vmovdqu %%ymm10, 320(" OUT ")\n\t vmovdqu %%ymm11, 352(" OUT ")\n\t"

#define QB_ASM_LOOP_BEGIN_ACC12(N) QB_ASM_ZERO_ACC12 QB_ASM_LOOP_OPEN(N)
#define QB_ASM_LOOP_END_ACC12(N, OUT) QB_ASM_LOOP_CLOSE(N) QB_ASM_STORE_ACC12(OUT)
