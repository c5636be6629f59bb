// The weight-only Linear ops (woq_ops.cpp, where their contracts are) as C++ functions, for native
// callers that run several of them in one call (runtime/decoder_layer.cpp).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace qbackend::ops {

at::Tensor woq_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                      const std::optional<at::Tensor>& bias);
at::Tensor woq_a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                         const std::optional<at::Tensor>& bias);
at::Tensor woq4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& offsets,
                       int64_t group_size, int64_t in_features, int64_t out_features,
                       const std::optional<at::Tensor>& bias);
at::Tensor woq4a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                         const at::Tensor& offsets, int64_t group_size, int64_t in_features, int64_t out_features,
                         const std::optional<at::Tensor>& bias);

}  // namespace qbackend::ops
