// qbackend._C.ForwardPlan: a converted model's forward replayed as one native call (forward_plan.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace qbackend {

// Adds the ForwardPlan class to the extension module.
void register_forward_plan(pybind11::module_& m);

}  // namespace qbackend
