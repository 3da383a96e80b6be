// How a backend runs ATen operators on its device memory: the `native`
// route of backends/<name>/ops.conf. (The other route, cpu_fallback, is the
// daemon's: it copies the operands to the host, runs ATen's CPU kernel and
// copies the results back, all ordered on the op's stream.)
//
// The daemon decodes an operator call into a boxed stack whose tensors were
// made by WrapDeviceMemory, then calls Call. The only translation units that
// include this header are the daemon's executor and the backends' op files
// (ATen headers are slow to compile).
//
// Completion: Call issues the kernel on `stream` and may return before it
// has run, as every stream-ordered call of the runtime contract
// (flagos/runtime.h). Tensors the kernel returns by value that are not over
// device memory (host tensors) are complete when Call returns.
#ifndef FLAGOS_BACKENDS_OP_EXECUTOR_H_
#define FLAGOS_BACKENDS_OP_EXECUTOR_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "flagos/kernel_facts.h"
#include "flagos/runtime.h"

namespace flagos {

// A native kernel's refusal of one call that the cpu_fallback route can
// run instead: the vendor library's NOT_IMPLEMENT, a dtype or an argument
// it does not take. Nothing was issued. UNIMPLEMENTED, marked so that the
// op runner tells it from an operator that fails on every route.
inline constexpr absl::string_view kDeclinedPayload = "flagos.dev/declined";
inline absl::Status DeclinedError(absl::string_view why) {
  absl::Status status = absl::UnimplementedError(why);
  status.SetPayload(kDeclinedPayload, absl::Cord("1"));
  return status;
}
inline bool IsDeclined(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnimplemented &&
         status.GetPayload(kDeclinedPayload).has_value();
}

class OpExecutor {
 public:
  virtual ~OpExecutor() = default;
  // The c10 device ops run on for `device` (kCPU for the CPU backend).
  virtual c10::Device AtenDevice(int device) const = 0;
  // A tensor over device memory; the caller keeps the memory alive for the
  // tensor's lifetime. `ptr` addresses the tensor's first element.
  virtual at::Tensor WrapDeviceMemory(int device, DevicePtr ptr, c10::IntArrayRef sizes,
                                      c10::IntArrayRef strides, c10::ScalarType dtype) = 0;
  // Runs `op` on `stack` (arguments in, returns out). Errors raised by the
  // kernel come back as a status naming the op.
  virtual absl::Status Call(int device, StreamHandle stream, const c10::OperatorHandle& op,
                            torch::jit::Stack* stack) = 0;
  // Runs functional `op` on `stack` (its arguments) with its results
  // written into `outputs` (one per tensor it returns, lists flattened;
  // already of the right sizes and dtypes), so the kernel needs no memory
  // of its own. On OK the stack is left empty. DeclinedError when it cannot
  // (the default: executors whose kernels allocate their results run
  // functional ops through Call).
  virtual absl::Status CallInto(int device, StreamHandle stream, const c10::OperatorHandle& op,
                                torch::jit::Stack* stack, const std::vector<at::Tensor>& outputs) {
    (void)device, (void)stream, (void)op, (void)stack, (void)outputs;
    return DeclinedError("this backend's kernels return their results");
  }
  // Whether the host can address the memory its kernels run on (ATen's
  // CPU kernels over host memory can). When not, the op runner never hands
  // it a call whose results must travel by value, and never replaces its
  // out= arguments by host scratch tensors.
  virtual bool host_addressable() const { return true; }
  // Whether it has a kernel of its own for `op`, which runs the op as one
  // call (not decomposed into other operators). The daemon reports the
  // composite operators it can run this way (execution/composite_ops.h).
  virtual bool HasKernel(const c10::OperatorHandle& op) const = 0;
  // What its kernels return that their meta functions do not say
  // (kernel_facts.h). Constant; valid for the executor's lifetime.
  virtual const std::vector<KernelFact>& kernel_facts() const = 0;
};

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_OP_EXECUTOR_H_
