// Each provider unit's kernels, registered on a torch::Library by providers/registrations.cpp
// (which holds every provider op's schema).
#pragma once
#include <torch/library.h>

namespace qbackend {

// m.impl of each (op name, kernel) pair, in order.
inline void impl_each(torch::Library&) {}
template <class Kernel, class... Rest>
void impl_each(torch::Library& m, const char* name, Kernel kernel, Rest... rest) {
  m.impl(name, kernel);
  impl_each(m, rest...);
}

void register_fbgemm_linear(torch::Library& m);
void register_native_linear(torch::Library& m);
void register_onednn_linear(torch::Library& m);
void register_fbgemm_conv2d(torch::Library& m);
void register_native_conv2d(torch::Library& m);
void register_native_inverted_residual(torch::Library& m);
void register_onednn_conv2d(torch::Library& m);

}  // namespace qbackend
