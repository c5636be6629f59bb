// qbackend._C.DecoderLayer: a Llama-style decoder layer's computation in two native calls
// (decoder_layer.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace qbackend {

// Adds the DecoderLayer class to the extension module.
void register_decoder_layer(pybind11::module_& m);

}  // namespace qbackend
