// torch ops for rowwise-quantized embedding tables (layout and arithmetic: kernels/embedding_kernels.h):
//
//   qbackend::embedding_bag_rowwise(table, dim, bits, indices, offsets, mode, per_sample_weights,
//                                   include_last_offset, padding_idx) -> float32 [bags, dim]
//   qbackend::embedding_rowwise(table, dim, bits, indices) -> float32 [*indices.shape, dim]
//   qbackend::embedding_bag_check(num_rows, indices, offsets, mode, per_sample_weights,
//                                 include_last_offset, padding_idx) -> ()
//   qbackend::fbgemm_embedding_bag(table, dim, bits, indices, offsets, mode, per_sample_weights,
//                                  include_last_offset) -> float32 [bags, dim]
//
// embedding_bag_rowwise is qbackend's own kernel (kernels/embedding_*.cpp: every layout,
// padding_idx); fbgemm_embedding_bag runs FBGEMM's JIT-generated SpMDM kernels (exported by
// libtorch_cpu; the kernels fbgemm_gpu's CPU lookup uses too) on fp16-qparams tables, without
// padding_idx. Both follow FBGEMM's arithmetic, so they give the same bits.
//
// Every index, offset and weight is checked before any row is read (the check op is the same
// scan, for providers that do not check, e.g. fbgemm_gpu's lookup): an index outside
// [0, num_rows) is an IndexError; offsets that do not start at 0, decrease, or end beyond the
// number of indices are a ValueError. mode: 0 = sum, 1 = mean.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/arange.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

#include <fbgemm/FbgemmEmbedding.h>

#include "cpu/kernel_table.h"
#include "kernels/embedding_kernels.h"
#include "common/checks.h"
#include "runtime/parallel.h"

namespace qbackend::ops {
namespace {

using kernels::EmbeddingBagArgs;

const kernels::EmbeddingKernels& pick_kernels() {
  return cpu::kernel_table(&kernels::embedding_kernels_scalar, &kernels::embedding_kernels_avx2,
                           &kernels::embedding_kernels_avx512);
}

struct TableInfo {
  int64_t rows, row_bytes, data_bytes;
  bool fp32_qparams;
};

TableInfo check_table(const at::Tensor& table, int64_t dim, int64_t bits) {
  checks::dtype(table, at::kByte, "table");
  TORCH_CHECK_VALUE(table.dim() == 2 && table.is_contiguous(), "table must be a contiguous 2-D uint8 tensor "
                    "(rows x row bytes), got shape ", table.sizes());
  TORCH_CHECK_VALUE(bits == 8 || bits == 4, "bits must be 8 or 4, got ", bits);
  TORCH_CHECK_VALUE(dim > 0 && (bits == 8 || dim % 2 == 0), "dim must be positive (and even for 4 bits), got ", dim);
  const int64_t data_bytes = bits == 8 ? dim : dim / 2;
  const int64_t qp_bytes = table.size(1) - data_bytes;  // rows: [scale][bias][data]
  TORCH_CHECK_VALUE(qp_bytes == 4 || qp_bytes == 8, "table rows must hold ", data_bytes, " data bytes and a "
                    "scale and bias (4 bytes fp16 or 8 bytes fp32), got rows of ", table.size(1), " bytes");
  return {table.size(0), table.size(1), data_bytes, qp_bytes == 8};
}

void check_index_tensor(const at::Tensor& t, const char* name) {
  checks::cpu(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
                   " must be torch.int32 or torch.int64, got ", checks::dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// Checks indices/offsets/weights; returns (number of bags, end of the last bag).
template <typename Index>
std::pair<int64_t, int64_t> check_bags(int64_t rows, const at::Tensor& indices, const at::Tensor& offsets,
                                       int64_t mode, const std::optional<at::Tensor>& weights,
                                       bool include_last_offset, int64_t padding_idx) {
  TORCH_CHECK_VALUE(indices.dim() == 1, "indices must be 1-D when offsets are given, got shape ", indices.sizes());
  TORCH_CHECK_VALUE(offsets.dim() == 1, "offsets must be 1-D, got shape ", offsets.sizes());
  TORCH_CHECK_TYPE(offsets.scalar_type() == indices.scalar_type(), "offsets must have the dtype of indices (",
                   checks::dtype_name(indices.scalar_type()), "), got ", checks::dtype_name(offsets.scalar_type()));
  TORCH_CHECK_VALUE(mode == 0 || mode == 1, "mode must be 0 (sum) or 1 (mean), got ", mode);
  TORCH_CHECK_VALUE(padding_idx >= -1 && padding_idx < rows, "padding_idx must be -1 (none) or a row in [0, ",
                    rows, "), got ", padding_idx);
  const int64_t n = indices.numel(), n_off = offsets.numel();
  TORCH_CHECK_VALUE(!include_last_offset || n_off >= 1, "with include_last_offset, offsets needs at least one "
                    "element (the end of the last bag)");
  const int64_t bags = include_last_offset ? n_off - 1 : n_off;
  const Index* off = offsets.const_data_ptr<Index>();
  if (n_off > 0) TORCH_CHECK_VALUE(off[0] == 0, "offsets[0] must be 0 (the first bag starts at the first index), got ",
                                   static_cast<int64_t>(off[0]));
  bool sorted = true;  // one vectorisable pass; the message looks for the first offender
  for (int64_t b = 1; b < n_off; ++b) sorted &= off[b] >= off[b - 1];
  if (!sorted)
    for (int64_t b = 1; b < n_off; ++b)
      TORCH_CHECK_VALUE(off[b] >= off[b - 1], "offsets must be non-decreasing; offsets[", b, "] = ",
                        static_cast<int64_t>(off[b]), " < offsets[", b - 1, "] = ", static_cast<int64_t>(off[b - 1]));
  if (n_off > 0) TORCH_CHECK_VALUE(static_cast<int64_t>(off[n_off - 1]) <= n, "the last offset (",
                                   static_cast<int64_t>(off[n_off - 1]), ") is beyond the number of indices (", n, ")");
  const int64_t last_end = include_last_offset ? (n_off > 0 ? static_cast<int64_t>(off[n_off - 1]) : 0) : n;
  TORCH_CHECK_VALUE(bags > 0 || n == 0 || include_last_offset, "indices are given but offsets is empty (no bags)");
  const Index* idx = indices.const_data_ptr<Index>();
  // min / max in vectorisable passes, on every thread (both 0 when n == 0)
  std::atomic<bool> in_range{true};
  parallel::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    Index lo = idx[b], hi = idx[b];
    for (int64_t i = b + 1; i < e; ++i) {
      lo = std::min(lo, idx[i]);
      hi = std::max(hi, idx[i]);
    }
    if (lo < 0 || static_cast<int64_t>(hi) >= rows) in_range = false;
  });
  if (!in_range.load())
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK_INDEX(idx[i] >= 0 && static_cast<int64_t>(idx[i]) < rows, "indices[", i, "] = ",
                        static_cast<int64_t>(idx[i]), " is out of range for a table of ", rows, " rows");
  if (weights.has_value() && weights->defined()) {
    checks::dtype(*weights, at::kFloat, "per_sample_weights");
    TORCH_CHECK_VALUE(mode == 0, "per_sample_weights are only supported with mode sum (as in nn.EmbeddingBag)");
    TORCH_CHECK_VALUE(weights->dim() == 1 && weights->numel() == n && weights->is_contiguous(),
                      "per_sample_weights must be a contiguous 1-D tensor with one weight per index (", n,
                      "), got shape ", weights->sizes());
  }
  return {bags, last_end};
}

void embedding_bag_check(int64_t num_rows, const at::Tensor& indices, const at::Tensor& offsets, int64_t mode,
                         const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                         int64_t padding_idx) {
  check_index_tensor(indices, "indices");
  check_index_tensor(offsets, "offsets");
  TORCH_CHECK_VALUE(num_rows > 0, "num_rows must be positive, got ", num_rows);
  if (indices.scalar_type() == at::kInt)
    check_bags<int32_t>(num_rows, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx);
  else
    check_bags<int64_t>(num_rows, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx);
}

template <typename Index>
at::Tensor run_bags(const at::Tensor& table, const TableInfo& t, int64_t dim, int64_t bits, const at::Tensor& indices,
                    const at::Tensor& offsets, int64_t mode, const std::optional<at::Tensor>& weights,
                    bool include_last_offset, int64_t padding_idx) {
  const auto [bags, last_end] = check_bags<Index>(t.rows, indices, offsets, mode, weights, include_last_offset,
                                                  padding_idx);
  at::Tensor out = at::empty({bags, dim}, table.options().dtype(at::kFloat));
  if (bags == 0) return out;
  EmbeddingBagArgs<Index> a{table.const_data_ptr<uint8_t>(), t.row_bytes, dim, indices.const_data_ptr<Index>(),
                            indices.numel(), offsets.const_data_ptr<Index>(), bags, last_end,
                            weights.has_value() && weights->defined() ? weights->const_data_ptr<float>() : nullptr,
                            mode == 1, padding_idx, out.data_ptr<float>()};
  const auto& k = pick_kernels();
  kernels::EmbeddingBagFn<Index> fn;
  if constexpr (std::is_same_v<Index, int32_t>) fn = k.bag32[bits == 4][t.fp32_qparams];
  else fn = k.bag64[bits == 4][t.fp32_qparams];
  // About 1 us per bag of a few dozen rows: small grains keep both threads busy on skewed bags
  // (benchmarks/results/design_measurements.md, "Embedding bag grains").
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, indices.numel() / bags + 1) / (dim / 64 + 1));
  parallel::parallel_for(0, bags, grain, [&](int64_t b0, int64_t b1) { fn(a, b0, b1); });
  return out;
}

at::Tensor embedding_bag_rowwise(const at::Tensor& table, int64_t dim, int64_t bits, const at::Tensor& indices,
                                 const at::Tensor& offsets, int64_t mode,
                                 const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
                                 int64_t padding_idx) {
  const TableInfo t = check_table(table, dim, bits);
  check_index_tensor(indices, "indices");
  check_index_tensor(offsets, "offsets");
  if (indices.scalar_type() == at::kInt)
    return run_bags<int32_t>(table, t, dim, bits, indices, offsets, mode, per_sample_weights, include_last_offset,
                             padding_idx);
  return run_bags<int64_t>(table, t, dim, bits, indices, offsets, mode, per_sample_weights, include_last_offset,
                           padding_idx);
}

at::Tensor embedding_rowwise(const at::Tensor& table, int64_t dim, int64_t bits, const at::Tensor& indices) {
  check_table(table, dim, bits);
  check_index_tensor(indices, "indices");
  const at::Tensor flat = indices.reshape({-1});
  // One bag per index: offsets 0, 1, ..., n-1 (the same kernel, so the same arithmetic).
  const at::Tensor offsets = at::arange(flat.numel(), flat.options());
  at::Tensor out = embedding_bag_rowwise(table, dim, bits, flat, offsets, 0, std::nullopt, false, -1);
  std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
  shape.push_back(dim);
  return out.view(shape);
}

template <typename Index>
at::Tensor run_fbgemm(const at::Tensor& table, const TableInfo& t, int64_t dim, int64_t bits,
                      const at::Tensor& indices, const at::Tensor& offsets, int64_t mode,
                      const std::optional<at::Tensor>& weights, bool include_last_offset) {
  const auto [bags, last_end] = check_bags<Index>(t.rows, indices, offsets, mode, weights, include_last_offset, -1);
  at::Tensor out = at::empty({bags, dim}, table.options().dtype(at::kFloat));
  if (bags == 0) return out;
  // FBGEMM wants bags + 1 offsets (the last one: the end of the last bag).
  at::Tensor off = offsets;
  if (!include_last_offset) {
    off = at::empty({bags + 1}, offsets.options());
    std::copy_n(offsets.const_data_ptr<Index>(), bags, off.data_ptr<Index>());
    off.data_ptr<Index>()[bags] = static_cast<Index>(last_end);
  }
  const bool has_weight = weights.has_value() && weights->defined();
  const bool mean = mode == 1;
  constexpr int kPrefetch = 16;
  using Kernel = typename fbgemm::EmbeddingSpMDMKernelSignature<uint8_t, Index, Index, float>::Type;
  const Kernel kernel =
      bits == 8 ? fbgemm::GenerateEmbeddingSpMDMWithStrides<uint8_t, Index, Index, float>(
                      dim, has_weight, mean, kPrefetch, /*is_weight_positional=*/false, /*use_offsets=*/true,
                      /*output_stride=*/-1, /*input_stride=*/t.row_bytes, /*scale_bias_last=*/false)
                : fbgemm::GenerateEmbeddingSpMDMNBitWithStrides<Index, Index, float>(
                      4, dim, has_weight, mean, kPrefetch, false, true, -1, t.row_bytes, /*scale_bias_last=*/false);
  const uint8_t* w = table.const_data_ptr<uint8_t>();
  const Index* idx = indices.const_data_ptr<Index>();
  const Index* o = off.const_data_ptr<Index>();
  const float* pw = has_weight ? weights->const_data_ptr<float>() : nullptr;
  float* y = out.data_ptr<float>();
  std::atomic<bool> ok{true};
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, indices.numel() / bags + 1));
  parallel::parallel_for(0, bags, grain, [&](int64_t b0, int64_t b1) {
    const int64_t first = static_cast<int64_t>(o[b0]);
    if (!kernel(b1 - b0, static_cast<int64_t>(o[b1]) - first, t.rows, w, idx + first, o + b0,
                pw != nullptr ? pw + first : nullptr, y + b0 * dim))
      ok = false;
  });
  TORCH_CHECK(ok.load(), "FBGEMM's embedding kernel refused the (checked) indices");  // not expected
  return out;
}

at::Tensor fbgemm_embedding_bag(const at::Tensor& table, int64_t dim, int64_t bits, const at::Tensor& indices,
                                const at::Tensor& offsets, int64_t mode,
                                const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset) {
  const TableInfo t = check_table(table, dim, bits);
  TORCH_CHECK_VALUE(!t.fp32_qparams, "FBGEMM's embedding kernels take fp16 scale/bias rows; this table has fp32 "
                    "ones (use the builtin provider)");
  check_index_tensor(indices, "indices");
  check_index_tensor(offsets, "offsets");
  if (indices.scalar_type() == at::kInt)
    return run_fbgemm<int32_t>(table, t, dim, bits, indices, offsets, mode, per_sample_weights, include_last_offset);
  return run_fbgemm<int64_t>(table, t, dim, bits, indices, offsets, mode, per_sample_weights, include_last_offset);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(qbackend, m) {
  m.def("embedding_bag_rowwise(Tensor table, int dim, int bits, Tensor indices, Tensor offsets, int mode, "
        "Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> Tensor");
  m.def("embedding_rowwise(Tensor table, int dim, int bits, Tensor indices) -> Tensor");
  m.def("fbgemm_embedding_bag(Tensor table, int dim, int bits, Tensor indices, Tensor offsets, int mode, "
        "Tensor? per_sample_weights=None, bool include_last_offset=False) -> Tensor");
  m.def("embedding_bag_check(int num_rows, Tensor indices, Tensor offsets, int mode, Tensor? per_sample_weights=None, "
        "bool include_last_offset=False, int padding_idx=-1) -> ()");
}

TORCH_LIBRARY_IMPL(qbackend, CPU, m) {
  m.impl("embedding_bag_rowwise", &embedding_bag_rowwise);
  m.impl("embedding_rowwise", &embedding_rowwise);
  m.impl("embedding_bag_check", &embedding_bag_check);
  m.impl("fbgemm_embedding_bag", &fbgemm_embedding_bag);
}

}  // namespace qbackend::ops
