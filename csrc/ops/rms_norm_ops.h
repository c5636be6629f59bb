// qbackend::rms_norm (rms_norm_ops.cpp, where its contract is) as a C++ function, for native callers.
#pragma once
#include <ATen/core/Tensor.h>

namespace qbackend::ops {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace qbackend::ops
