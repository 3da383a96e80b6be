// Runs ATen operators for the CPU backend: device memory is host memory, so
// a tensor over it is a plain CPU tensor (at::from_blob, no deleter) and ops
// run on ATen's CPU kernels.
//
// Thread safety: stateless; may be used from any number of threads.
#ifndef FLAGOS_BACKENDS_CPU_CPU_OP_EXECUTOR_H_
#define FLAGOS_BACKENDS_CPU_CPU_OP_EXECUTOR_H_

#include <memory>

#include "flagos/op_executor.h"

namespace flagos {

class CpuOpExecutor final : public OpExecutor {
 public:
  // `foreach_lists`: whether HasKernel claims the _foreach_ list operators
  // (below).
  explicit CpuOpExecutor(bool foreach_lists = false) : foreach_lists_(foreach_lists) {}

  c10::Device AtenDevice(int device) const override;
  at::Tensor WrapDeviceMemory(int device, DevicePtr ptr, c10::IntArrayRef sizes,
                              c10::IntArrayRef strides, c10::ScalarType dtype) override;
  // Calls `op` below autograd (the client does autograd). A c10::Error
  // becomes INVALID_ARGUMENT (UNIMPLEMENTED for NotImplementedError,
  // RESOURCE_EXHAUSTED for OutOfMemoryError), any other exception INTERNAL;
  // the message is "<op name>: <error without the C++ backtrace>".
  // The kernel runs in the calling thread (complete when Call returns), so
  // `stream` only orders it after the caller's earlier calls.
  absl::Status Call(int device, StreamHandle stream, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) override;
  // ATen's CPU kernel for `op` (registered for DispatchKey::CPU itself, not
  // a composite implementation), or, with `foreach_lists`, for the _foreach_
  // list operators (which ATen runs on the CPU through their
  // CompositeExplicitAutograd loop over the list) that loop: so an
  // optimizer step sends one call per list instead of one per tensor.
  bool HasKernel(const c10::OperatorHandle& op) const override;
  // CpuKernelFacts() (cpu_kernel_facts.h).
  const std::vector<KernelFact>& kernel_facts() const override;

 private:
  const bool foreach_lists_;
};

// The cpu backend's native route runs the _foreach_ lists whole
// (foreach_lists); the cpu_fallback route of another backend does not
// claim them, so that a client decomposes them and their per-tensor pieces
// may take that backend's native kernels.
std::unique_ptr<OpExecutor> CreateCpuOpExecutor(bool foreach_lists = false);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_CPU_CPU_OP_EXECUTOR_H_
