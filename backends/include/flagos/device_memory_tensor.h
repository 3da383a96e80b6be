// A tensor over device memory the host cannot address, on c10's
// PrivateUse1 device: what the native OpExecutors of such backends hand
// their kernels (the xdnn binding, the collective library), which pass its
// address on and never dereference it. Includes an ATen header: only op executor
// translation units include it.
#ifndef FLAGOS_BACKENDS_DEVICE_MEMORY_TENSOR_H_
#define FLAGOS_BACKENDS_DEVICE_MEMORY_TENSOR_H_

#include <ATen/ops/from_blob.h>

#include "flagos/runtime.h"

namespace flagos {

inline c10::Device PrivateUse1Device(int device) {
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
}

// `ptr` addresses the tensor's first element; the caller keeps the memory
// alive for the tensor's lifetime (no deleter).
inline at::Tensor DeviceMemoryTensor(int device, DevicePtr ptr, c10::IntArrayRef sizes,
                                     c10::IntArrayRef strides, c10::ScalarType dtype) {
  const c10::Device where = PrivateUse1Device(device);
  return at::for_blob(reinterpret_cast<void*>(ptr), sizes)
      .strides(strides)
      .target_device(where)
      .options(at::TensorOptions().dtype(dtype).device(where))
      .make_tensor();
}

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_DEVICE_MEMORY_TENSOR_H_
