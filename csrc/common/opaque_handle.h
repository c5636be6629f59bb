// A packed weight as a plain uint8 tensor that owns a C++ object (e.g. fbgemm::PackBMatrix).
//
// The tensor's bytes are the object's packed buffer; its storage's DataPtr context is the object
// and its deleter frees it. The ops recover the object from the tensor and check the deleter, so a
// copy (clone, deepcopy, torch.save/load) that lost the object gets a clear error, not a crash.
// Keeping packed weights as tensors lets torch.compile / torch.export treat them as ordinary
// module buffers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <memory>

namespace qbackend {

template <class T>
void delete_opaque(void* ctx) {
  delete static_cast<T*>(ctx);
}

template <class T>
at::Tensor wrap_opaque(std::unique_ptr<T> obj, void* data, at::IntArrayRef sizes) {
  T* raw = obj.release();
  return at::for_blob(data, sizes)
      .context(raw, &delete_opaque<T>)
      .options(at::TensorOptions().dtype(at::kByte).device(at::kCPU))
      .make_tensor();
}

template <class T>
T& unwrap_opaque(const at::Tensor& t, const char* name, const char* what) {
  TORCH_CHECK_VALUE(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kByte &&
                        t.has_storage(),
                    name, " must be a ", what, " packed by qbackend, got another tensor");
  const c10::DataPtr& dp = t.storage().data_ptr();
  TORCH_CHECK_VALUE(dp.get_deleter() == &delete_opaque<T> && dp.get_context() != nullptr, name,
                    " is not a live ", what,
                    ": it is a copy (clone, deepcopy and torch.save/load keep only the bytes) or another kind of "
                    "tensor; repack the int8 weight with that prepack function");
  return *static_cast<T*>(dp.get_context());
}

}  // namespace qbackend
