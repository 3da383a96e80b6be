// CUDA's dtypes on ATen's CPU kernels. Libraries branch on `device.type` and
// take their CUDA path on every device that is not the CPU, so flagos must
// accept the dtypes CUDA's kernels accept. Where ATen's CPU kernel of an
// operator lacks a dtype that its CUDA kernel has (histc on integers,
// avg_pool3d on float16 ...), the call runs in a wider compute dtype and
// its results are converted back, giving CUDA's results.
//
// The table (CpuDtypeWidenings, in cpu_dtype_widening.cc; listed with each
// entry's CUDA semantics in docs/reference/dtype-widening.md) is declared,
// not discovered: a call is widened only when its operator is in the table
// and its first tensor argument has one of the entry's missing dtypes.
// Every other call runs the kernel as it is, and a dtype missing on both
// devices still fails with the kernel's own "not implemented for" error.
//
// A widened call (CallWidened):
//   - every tensor argument (and Tensor[] element) of the missing dtype is
//     replaced by a copy in the compute dtype; tensors of other dtypes
//     (indices, targets) are left alone;
//   - an argument the kernel writes (in-place self, out=, Tensor(a!)) is
//     written back into the original after the call, converting (so its
//     storage, sizes and strides are the caller's);
//   - with `integer_scalars`, Scalar arguments are truncated to integers
//     first, as CUDA's integer kernels read them (Scalar::to<int64_t>);
//   - a tensor return in the compute dtype, or its complex or real
//     counterpart, is converted to the missing dtype (or its counterpart);
//     a return of another dtype is what CUDA returns as well (trace of
//     bool: int64) and stays; a return that is a written argument is that
//     original argument.
//
// Thread safety: the table is immutable; the functions may be called from
// any number of threads.
#ifndef FLAGOS_BACKENDS_CPU_CPU_DTYPE_WIDENING_H_
#define FLAGOS_BACKENDS_CPU_CPU_DTYPE_WIDENING_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

#include <vector>

namespace flagos {

struct DtypeWidening {
  const char* op;            // "aten::histc": every overload of it
  c10::ScalarType missing;   // a dtype CUDA's kernel has and the CPU's lacks
  c10::ScalarType compute;   // the dtype the CPU kernel runs in instead
  bool integer_scalars;      // Scalar arguments truncated to integers first
  const char* cuda;          // what CUDA does (the page has each row's semantics)
};

// The declared table, in operator order.
const std::vector<DtypeWidening>& CpuDtypeWidenings();

// The entry that applies to calling `op` on `stack` (its arguments), or
// nullptr when the call runs unchanged.
const DtypeWidening* FindDtypeWidening(const c10::OperatorHandle& op,
                                       const torch::jit::Stack& stack);

// Calls `op` on `stack` (arguments in, returns out) in `widening`'s compute
// dtype, as described above. Throws what the kernel throws.
void CallWidened(const c10::OperatorHandle& op, const DtypeWidening& widening,
                 torch::jit::Stack* stack);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_CPU_CPU_DTYPE_WIDENING_H_
