// One operator call's environment: its backend, device and stream, its
// route's kernels (the backend's native OpExecutor, or the host executor on
// the cpu_fallback route, whose host copies of device memory are the
// call's HostMirror), the session's range check, the host-memory budget of
// its kernels, and the tensors it makes over the memory the call names.
// The argument decoder (op_argument_decoder.h) and the result encoder
// (op_result_encoder.h) work through it; the op runner makes one per call.
//
// Thread safety: one call's object, used by the thread running the call.
#ifndef FLAGOS_DAEMON_OPS_OP_CALL_CONTEXT_H_
#define FLAGOS_DAEMON_OPS_OP_CALL_CONTEXT_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "execution/backend.h"
#include "flagos/v1/flagos.pb.h"
#include "ops/host_mirror.h"
#include "ops/op_error_context.h"
#include "ops/op_runner.h"
#include "protocol/command_validation.h"

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace flagos::daemon {

class HeldResults;

class OpCallContext {
 public:
  // `op_name` ("aten::add.Tensor", errors name the op so) and `check`
  // outlive the context. `mirror`: the call's host copies on the
  // cpu_fallback route; nullptr on the native route.
  // `max_host_memory_bytes`: what each kernel call may hold (OpHostBudget).
  OpCallContext(const Backend& backend, int device, StreamHandle stream,
                const std::string& op_name, OpRunner::RangeCheck check, HostMirror* mirror,
                uint64_t max_host_memory_bytes)
      : backend_(backend),
        device_(device),
        stream_(stream),
        op_name_(op_name),
        check_(check),
        mirror_(mirror),
        max_host_memory_bytes_(max_host_memory_bytes) {}

  const Backend& backend() const { return backend_; }
  // The device the op runs on (its command's).
  int device() const { return device_; }
  const std::string& op_name() const { return op_name_; }

  // Tensor returns are kept in `held` (reported as Value.held) instead of
  // being sent by value; nullptr (the default) sends them.
  void set_held_results(HeldResults* held) { held_ = held; }
  HeldResults* held_results() const { return held_; }

  // Tensors wrapped while this is set are arguments the kernel writes
  // (Tensor(a!)) or outputs: on the cpu_fallback route their bytes go back
  // to the device after the call.
  void set_writing(bool writing) { writing_ = writing; }

  // The device the kernels of this call run on for device index `device`:
  // the backend's for the native route, the host's for cpu_fallback.
  c10::Device KernelDevice(int device) const;

  // Runs `op` on the route's kernels, charging the host memory they
  // allocate on this thread to a budget of --max-op-host-memory
  // (RESOURCE_EXHAUSTED naming the op, what it asked and the flag beyond).
  absl::Status CallKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Runs functional `op` on the native route's kernels with its results
  // written into `outputs` (OpExecutor::CallInto).
  absl::Status CallKernelInto(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                              const std::vector<at::Tensor>& outputs);

  // cpu_fallback: adds the device memory `value` names (tensors, lists of
  // them) to the mirror, after checking its range. `out_argument`: an out=
  // argument, which the kernel only writes.
  absl::Status MirrorValue(const v1::Value& value, bool out_argument, const ValueWhere& where);
  // The same for one ref; `write_only`: the kernel only writes it (a dense
  // one need not be read first).
  absl::Status MirrorRef(const v1::TensorRef& ref, bool write_only, const ValueWhere& where);

  // A ref's extent, after checking its descriptor, its device (one device
  // on the cpu_fallback route) and its range (through the session's check;
  // an empty tensor's range is not checked: it names no byte).
  absl::StatusOr<TensorExtent> CheckedExtent(const v1::TensorRef& ref, const ValueWhere& where);

  // A tensor over device memory (native route; an empty one over no memory,
  // never the address sent) or over its host copy (cpu_fallback), after
  // CheckedExtent; an undefined ref is an undefined tensor. The client's
  // lazy conj/neg bits become views the kernels understand.
  absl::StatusOr<at::Tensor> WrapTensor(const v1::TensorRef& ref, const ValueWhere& where);

 private:
  const Backend& backend_;
  const int device_;
  const StreamHandle stream_;
  const std::string& op_name_;
  OpRunner::RangeCheck check_;
  HostMirror* const mirror_;
  const uint64_t max_host_memory_bytes_;
  HeldResults* held_ = nullptr;
  bool writing_ = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_CALL_CONTEXT_H_
