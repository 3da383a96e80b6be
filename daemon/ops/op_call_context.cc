// One operator call's environment (op_call_context.h).
#include "ops/op_call_context.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>

#include "absl/strings/str_cat.h"
#include "byte_size.h"
#include "flagos/op_executor.h"
#include "ops/op_host_budget.h"
#include "ops/wrapped_tensor_cache.h"

namespace flagos::daemon {
namespace {

absl::Status HostMemoryExhausted(const std::string& op_name, const OpHostBudget& budget) {
  return absl::ResourceExhaustedError(absl::StrCat(
      op_name, ": its kernel asked for ", budget.refused_bytes(), " bytes of host memory while "
      "holding ", budget.charged_when_refused(), "; an op's kernel may hold at most ",
      budget.limit_bytes(), " bytes (--max-op-host-memory=", FormatByteSize(budget.limit_bytes()),
      "); split the work into smaller calls, or start flagosd with a larger "
      "--max-op-host-memory"));
}

}  // namespace

c10::Device OpCallContext::KernelDevice(int device) const {
  if (mirror_ != nullptr) return c10::Device(c10::kCPU);
  return backend_.native_executor()->AtenDevice(device);
}

absl::Status OpCallContext::CallKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpHostBudget budget(max_host_memory_bytes_);
  absl::Status status = mirror_ != nullptr
                            ? backend_.host_executor().Call(device_, stream_, op, stack)
                            : backend_.native_executor()->Call(device_, stream_, op, stack);
  // However the kernel reported the refusal (kernels may catch and
  // rethrow it as another error), it is the budget's.
  if (!status.ok() && budget.refused()) return HostMemoryExhausted(op_name_, budget);
  return status;
}

absl::Status OpCallContext::CallKernelInto(const c10::OperatorHandle& op,
                                           torch::jit::Stack* stack,
                                           const std::vector<at::Tensor>& outputs) {
  if (mirror_ != nullptr) return absl::InternalError("CallKernelInto on the cpu_fallback route");
  return backend_.native_executor()->CallInto(device_, stream_, op, stack, outputs);
}

absl::Status OpCallContext::MirrorValue(const v1::Value& value, bool out_argument,
                                        const ValueWhere& where) {
  if (value.has_tensor()) return MirrorRef(value.tensor(), out_argument, where);
  if (value.has_list()) {
    for (int i = 0; i < value.list().values_size(); ++i) {
      if (absl::Status s = MirrorValue(value.list().values(i), out_argument, where.Element(i));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status OpCallContext::MirrorRef(const v1::TensorRef& ref, bool write_only,
                                      const ValueWhere& where) {
  if (ref.undefined()) return absl::OkStatus();
  absl::StatusOr<TensorExtent> extent = CheckedExtent(ref, where);
  if (!extent.ok()) return extent.status();
  if (extent->numel == 0) return absl::OkStatus();
  // A dense tensor the kernel only writes need not be read first.
  const bool dense = extent->nbytes == static_cast<uint64_t>(extent->numel) * extent->itemsize;
  mirror_->Add(extent->begin, extent->nbytes, !(write_only && dense));
  return absl::OkStatus();
}

absl::StatusOr<TensorExtent> OpCallContext::CheckedExtent(const v1::TensorRef& ref,
                                                       const ValueWhere& where) {
  absl::StatusOr<TensorExtent> extent = ComputeTensorExtent(ref);
  if (!extent.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op_name_, ": ", where.str(), ": ", extent.status().message()));
  }
  const int device_count = backend_.runtime().DeviceCount();
  if (ref.device() < 0 || ref.device() >= device_count) {
    return CheckDevice(ref.device(), device_count, absl::StrCat(op_name_, ": ", where.str()));
  }
  if (mirror_ != nullptr && ref.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        op_name_, ": ", where.str(), " is on ", DeviceName(ref.device()), " but the op runs on ",
        DeviceName(device_), "; the ", backend_.name(),
        " backend's cpu_fallback route takes operands of one device (copy it there first)"));
  }
  // An empty tensor reads and writes nothing (and its address may be 0);
  // its storage cannot grow, so no kernel can write through it.
  if (extent->numel > 0) {
    if (absl::Status s = check_(ref.device(), extent->begin, extent->nbytes); !s.ok()) return s;
  }
  return extent;
}

absl::StatusOr<at::Tensor> OpCallContext::WrapTensor(const v1::TensorRef& ref,
                                                  const ValueWhere& where) {
  if (ref.undefined()) return at::Tensor();
  absl::StatusOr<TensorExtent> extent = CheckedExtent(ref, where);
  if (!extent.ok()) return extent.status();
  // The ref's repeated fields are contiguous int64s: no copies.
  const c10::IntArrayRef sizes(ref.sizes().data(), ref.sizes_size());
  const c10::IntArrayRef strides(ref.strides().data(), ref.strides_size());
  const auto dtype = static_cast<c10::ScalarType>(ref.dtype());
  at::Tensor tensor;
  absl::Status status = Guarded(op_name_, where, [&]() {
    if (mirror_ != nullptr) {
      // The host copy. An empty tensor has no bytes to copy: it is wrapped
      // over no memory, as on the native route, so that its storage cannot
      // grow here either (a raw resize_ of it fails on both routes).
      const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(c10::kCPU);
      if (extent->numel == 0) {
        tensor = at::from_blob(nullptr, sizes, strides, options);
      } else {
        tensor = at::from_blob(mirror_->Address(extent->begin), sizes, strides, options);
        if (writing_) mirror_->MarkWritten(extent->begin, extent->nbytes);
      }
    } else {
      if ((ref.conj() || ref.neg()) && !backend_.native_executor()->host_addressable()) {
        return DeclinedError("a conjugate or negative-view operand");
      }
      // An empty tensor is wrapped over no memory (address 0), never the
      // address the client sent: its range is not checked (it spans no
      // bytes), so a kernel that touches data_ptr() of an empty tensor
      // anyway must not reach memory the session does not own.
      const uint64_t addr = extent->numel == 0 ? 0 : extent->begin;
      WrappedTensorCache::Slot slot =
          WrappedTensorCache::Find(&backend_, ref.device(), addr, sizes, strides, dtype);
      if (slot.hit) {
        tensor = *slot.tensor;
      } else {
        tensor = backend_.native_executor()->WrapDeviceMemory(ref.device(), addr, sizes,
                                                              strides, dtype);
        slot.Keep(tensor);
      }
    }
    // The client's lazy conj/neg bits, as views the kernels understand.
    if (ref.conj()) tensor = tensor._conj();
    if (ref.neg()) tensor = tensor._neg_view();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return tensor;
}

}  // namespace flagos::daemon
