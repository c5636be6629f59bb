// qbackend::row_keys(rows, multipliers) -> keys: a 64-bit key per row of a float32 [R, C] tensor, a
// function of the row's bits alone (the row samples of qbackend.algorithms.smoothquant.ChannelStats:
// the rows with the smallest keys are kept, so a sample is a function of the set of rows seen and
// samples merge exactly). In wrapping 64-bit arithmetic: h = sum over c of int64(the 32 bits of
// rows[r, c] as a signed integer) * multipliers[c], then MurmurHash3's 64-bit finalizer (h ^= h >> 33,
// h *= 0xff51afd7ed558ccd, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53, h ^= h >> 33; logical shifts).
// The reference: qbackend/ops/reference.py row_keys (the same math in torch int64 ops, bit for bit).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace qbackend::ops {
namespace {

at::Tensor row_keys(const at::Tensor& rows_in, const at::Tensor& multipliers_in) {
  TORCH_CHECK_TYPE(rows_in.scalar_type() == at::ScalarType::Float, "row_keys: rows must be float32, got ",
                   rows_in.scalar_type());
  TORCH_CHECK_TYPE(multipliers_in.scalar_type() == at::ScalarType::Long, "row_keys: multipliers must be int64");
  TORCH_CHECK_VALUE(rows_in.dim() == 2, "row_keys: rows must be 2-D [R, C], got ", rows_in.dim(), " dimensions");
  const int64_t r = rows_in.size(0), c = rows_in.size(1);
  TORCH_CHECK_VALUE(multipliers_in.dim() == 1 && multipliers_in.size(0) == c,
                    "row_keys: multipliers must be 1-D of length rows.size(1) = ", c);
  const at::Tensor rows = rows_in.contiguous(), mult = multipliers_in.contiguous();
  at::Tensor keys = at::empty({r}, rows.options().dtype(at::kLong));
  const float* xp = rows.const_data_ptr<float>();
  const int64_t* mp = mult.const_data_ptr<int64_t>();
  int64_t* kp = keys.mutable_data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(c, 1));
  at::parallel_for(0, r, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * c;
      uint64_t h = 0;
      for (int64_t j = 0; j < c; ++j) {
        int32_t bits;
        std::memcpy(&bits, row + j, sizeof bits);
        h += static_cast<uint64_t>(static_cast<int64_t>(bits)) * static_cast<uint64_t>(mp[j]);
      }
      h ^= h >> 33;
      h *= 0xff51afd7ed558ccdULL;
      h ^= h >> 33;
      h *= 0xc4ceb9fe1a85ec53ULL;
      h ^= h >> 33;
      kp[i] = static_cast<int64_t>(h);
    }
  });
  return keys;
}

}  // namespace
}  // namespace qbackend::ops

TORCH_LIBRARY_FRAGMENT(qbackend, m) { m.def("row_keys(Tensor rows, Tensor multipliers) -> Tensor"); }

TORCH_LIBRARY_IMPL(qbackend, CPU, m) { m.impl("row_keys", &qbackend::ops::row_keys); }
