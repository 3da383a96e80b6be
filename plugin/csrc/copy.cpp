#include "copy.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "graph_capture.h"
#include "pinned_allocator.h"
#include "runtime.h"
#include "tensor_codec.h"

namespace torch_fl {
namespace {

// The calling thread's current stream on `device` (what the device guard
// reports), on which copies are ordered.
c10::Stream CurrentStreamObject(int device) {
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  return guard.getStream(
      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}

uint64_t CurrentStreamOf(int device) {
  return static_cast<uint64_t>(CurrentStreamObject(device).id());
}

// The pinned region holding all of `host`'s bytes, when the daemon shares
// it (same-node sessions; over TCP pinned memory is ordinary memory).
std::optional<PinnedLocation> SharedPinned(const at::Tensor& host) {
  std::optional<PinnedLocation> where = FindPinned(host.const_data_ptr(), host.nbytes());
  if (!where || where->region == 0) return std::nullopt;
  return where;
}

// A tensor whose elements fill exactly [first element, first + nbytes) of its
// storage in some order, so its bytes move as one contiguous block.
bool IsDenseBlock(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

// A CPU tensor with the same sizes, strides and dtype as `like` holding `src`.
at::Tensor HostStaging(const at::Tensor& like, const at::Tensor& src) {
  at::Tensor staging = at::empty_strided(like.sizes(), like.strides(),
                                         at::TensorOptions().dtype(like.scalar_type()));
  staging.copy_(src);
  return staging;
}

// Whether `host`'s memory already holds `device`'s bytes in the same
// layout, so they can move without a staging copy: same dtype, sizes and
// strides, a dense block, and no lazy conj/neg bits on either side.
bool SameBytes(const at::Tensor& host, const at::Tensor& device) {
  return host.scalar_type() == device.scalar_type() && host.sizes() == device.sizes() &&
         host.strides() == device.strides() && IsDenseBlock(host) && !host.is_conj() &&
         !host.is_neg() && !device.is_conj() && !device.is_neg();
}

// The values whose raw bytes make `t` read as `logical` once its lazy
// conj/neg bits apply (the bits are involutions).
at::Tensor ApplyBits(const at::Tensor& t, at::Tensor logical) {
  if (t.is_conj()) logical = logical.conj_physical();
  if (t.is_neg()) logical = logical.neg();
  return logical;
}

void CopyHostToDevice(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return;
  RefuseWhileCapturing(dst.device().index(), CurrentStreamOf(dst.device().index()),
                       "a copy from host memory to flagos");
  if (non_blocking && IsDenseBlock(dst) && SameBytes(src, dst)) {
    if (std::optional<PinnedLocation> pinned = SharedPinned(src)) {
      // The daemon reads the pinned region when the copy runs on the
      // stream; the block is not reused before then.
      const int device = dst.device().index();
      const c10::Stream stream = CurrentStreamObject(device);
      ThrowIfError(Session().UploadPinned(device, static_cast<uint64_t>(stream.id()),
                                          ElementAddr(dst), pinned->region, pinned->offset,
                                          dst.nbytes(),
                                          "copy pinned host → flagos:" + std::to_string(device)));
      RecordUse(pinned->block_ptr, stream);
      if (LaunchBlocking()) Synchronize(device);
      return;
    }
  }
  if (IsDenseBlock(dst)) {
    if (SameBytes(src, dst)) {  // straight from the source's memory
      UploadBytes(dst.device().index(), ElementAddr(dst), src.const_data_ptr(), dst.nbytes());
      return;
    }
    at::Tensor staging = HostStaging(dst, src);
    if (dst.is_conj() || dst.is_neg()) staging = HostStaging(dst, ApplyBits(dst, staging));
    UploadBytes(dst.device().index(), ElementAddr(dst), staging.const_data_ptr(),
                staging.nbytes());
    return;
  }
  // dst has gaps or overlaps (a slice, an expand): upload densely, then let
  // the daemon scatter it into place.
  at::Tensor dense = at::empty(dst.sizes(), dst.options().memory_format(at::MemoryFormat::Contiguous));
  CopyHostToDevice(src, dense, non_blocking);
  EnqueueDeviceCopy(dst, dense);
}

void CopyDeviceToHost(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (src.numel() == 0) return;
  RefuseWhileCapturing(src.device().index(), CurrentStreamOf(src.device().index()),
                       "a copy from flagos to host memory");
  if (non_blocking && IsDenseBlock(src) && SameBytes(dst, src)) {
    if (std::optional<PinnedLocation> pinned = SharedPinned(dst)) {
      // Returns at once: the daemon writes the pinned region when the copy
      // runs on the stream (the bytes are there once the stream has been
      // synchronised), and the block is not reused before then.
      const int device = src.device().index();
      const c10::Stream stream = CurrentStreamObject(device);
      ThrowIfError(Session().DownloadPinned(device, static_cast<uint64_t>(stream.id()),
                                            pinned->region, pinned->offset, ElementAddr(src),
                                            src.nbytes(),
                                            "copy flagos:" + std::to_string(device) +
                                                " → pinned host"));
      RecordUse(pinned->block_ptr, stream);
      if (LaunchBlocking()) Synchronize(device);
      return;
    }
  }
  if (!IsDenseBlock(src)) {
    at::Tensor dense = at::empty(src.sizes(), src.options());
    EnqueueDeviceCopy(dense, src);
    CopyDeviceToHost(dense, dst, non_blocking);
    return;
  }
  if (SameBytes(dst, src)) {  // straight into the destination's memory
    DownloadBytes(src.device().index(), ElementAddr(src), dst.data_ptr(), src.nbytes());
    return;
  }
  at::Tensor staging = at::empty_strided(src.sizes(), src.strides(),
                                         at::TensorOptions().dtype(src.scalar_type()));
  DownloadBytes(src.device().index(), ElementAddr(src), staging.data_ptr(), staging.nbytes());
  dst.copy_(ApplyBits(src, staging));
}

void CopyBetweenDevices(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.numel() == 0) return;
  int src_device = src.device().index();
  int dst_device = dst.device().index();
  // A dense, same-dtype block on the source device.
  at::Tensor block = src;
  if (!IsDenseBlock(src) || src.scalar_type() != dst.scalar_type() || src.is_conj() ||
      src.is_neg()) {
    c10::DeviceGuard guard(src.device());
    block = at::empty(src.sizes(), src.options().dtype(dst.scalar_type()));
    EnqueueDeviceCopy(block, src);
  }
  // The daemon runs a cross-device copy after every earlier command of the
  // source device, so the copy sees `block` complete.
  at::Tensor landing;
  {
    c10::DeviceGuard guard(dst.device());
    landing = at::empty_strided(block.sizes(), block.strides(), dst.options());
  }
  const uint64_t generation = CurrentGeneration();  // before any address is encoded
  flagos::v1::Command command;
  command.set_device(dst_device);
  auto* copy = command.mutable_copy_device_to_device();
  copy->set_src(ElementAddr(block));
  copy->set_src_device(src_device);
  copy->set_dst(ElementAddr(landing));
  copy->set_nbytes(block.nbytes());
  Enqueue(std::move(command),
          "copy flagos:" + std::to_string(src_device) + " → flagos:" + std::to_string(dst_device),
          std::nullopt, generation);
  // `block` is freed on return and the source device may reuse it for later
  // commands, which the copy does not wait for: let the copy finish first.
  Synchronize(dst_device);
  EnqueueDeviceCopy(dst, landing);
}

}  // namespace

void UploadBytes(int device, uint64_t addr, const void* data, uint64_t nbytes) {
  ThrowIfError(Session().Upload(device, CurrentStreamOf(device), addr, data, nbytes,
                                "copy host → flagos:" + std::to_string(device)));
  // Debugging: the copy completes before the call returns.
  if (LaunchBlocking()) Synchronize(device);
}

void DownloadBytes(int device, uint64_t addr, void* out, uint64_t nbytes) {
  // CopyDeviceToHost has refused already; .item() (minimal_ops.cpp) comes here.
  RefuseWhileCapturing(device, CurrentStreamOf(device), "a copy from flagos to host memory");
  ThrowIfError(Session().Download(device, CurrentStreamOf(device), out, addr, nbytes,
                                  "copy flagos:" + std::to_string(device) + " → host"));
}

void EnqueueDeviceCopy(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_INTERNAL_ASSERT(IsFlagos(dst) && IsFlagos(src) && dst.device() == src.device());
  if (dst.numel() == 0) return;
  const uint32_t op_id = OpId("aten::copy_", "");
  const uint64_t generation = CurrentGeneration();  // before any address is encoded
  flagos::v1::Command command;
  command.set_device(dst.device().index());
  auto* op = command.mutable_op();
  op->set_op_id(op_id);
  EncodeTensorRef(dst, op->add_args()->mutable_tensor());
  EncodeTensorRef(src, op->add_args()->mutable_tensor());
  op->add_args()->set_b(false);
  Enqueue(std::move(command), "aten::copy_", std::nullopt, generation);
}

at::Tensor CopyFrom(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.sizes() == src.sizes() || src.numel() == 1 || src.dim() <= dst.dim(),
              "flagos: copy_ between incompatible shapes ", src.sizes(), " and ", dst.sizes());
  // copy_ broadcasts src to dst's shape.
  at::Tensor source = src.sizes() == dst.sizes() ? src : src.expand(dst.sizes());
  if (IsFlagos(source) && IsFlagos(dst)) {
    if (source.device() == dst.device()) {
      EnqueueDeviceCopy(dst, source);
    } else {
      CopyBetweenDevices(source, dst);
    }
  } else if (IsFlagos(dst)) {
    TORCH_CHECK(source.device().is_cpu(), "flagos: cannot copy from ", source.device(),
                " to flagos; copy through the CPU");
    CopyHostToDevice(source, dst, non_blocking);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "flagos: cannot copy from flagos to ", dst.device(),
                "; copy through the CPU");
    CopyDeviceToHost(source, dst, non_blocking);
  }
  return dst;
}

}  // namespace torch_fl
