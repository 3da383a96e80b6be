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
// and strides; implements aten::_copy_from. Returns dst. With
// `non_blocking`, a copy between a flagos tensor and pinned host memory
// shared with the daemon (pinned_allocator.h) of the same dtype and layout
// moves no bytes in this process and returns at once, CUDA's semantics: the
// daemon reads (host → device) or writes (device → host) the pinned bytes
// when the copy runs on the current stream, and a device → host copy's
// bytes are there once that stream has been synchronised. Every other copy
// is blocking as without the flag.
at::Tensor CopyFrom(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

// Enqueues aten::copy_(dst, src) in the daemon (both on the same device).
void EnqueueDeviceCopy(const at::Tensor& dst, const at::Tensor& src);

}  // namespace torch_fl
