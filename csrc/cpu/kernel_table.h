// The one run-time choice of kernel table for the op families built once per ISA (scalar, AVX2,
// AVX512: quantize, observers, embeddings): the table of the highest build the level in use
// (cpu::usable_isa, after QBACKEND_ISA) can run.
#pragma once

#include "cpu/probe.h"

namespace qbackend::cpu {

template <class Table>
const Table& kernel_table(const Table& (*scalar)(), const Table& (*avx2)(), const Table& (*avx512)()) {
  if (has(Isa::Avx512)) return avx512();
  if (has(Isa::Avx2)) return avx2();
  return scalar();
}

}  // namespace qbackend::cpu
