// Moving bytes and tensors between the host and flagos devices.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torch_fl {

// Raw byte transfers, split into protocol-sized chunks. Upload returns
// without waiting; Download waits for earlier commands of the device.
void UploadBytes(int device, uint64_t addr, const void* data, uint64_t nbytes);
void DownloadBytes(int device, uint64_t addr, void* out, uint64_t nbytes);

// dst.copy_(src) for any combination of CPU and flagos tensors, any dtypes
// and strides; implements aten::_copy_from. Returns dst.
at::Tensor CopyFrom(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

// Enqueues aten::copy_(dst, src) in the daemon (both on the same device).
void EnqueueDeviceCopy(const at::Tensor& dst, const at::Tensor& src);

}  // namespace torch_fl
