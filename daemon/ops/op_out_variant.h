// out= overloads, two ways:
//   - a functional op whose client sent an output for every return runs as
//     its out= overload, straight into those outputs (FindOutVariant finds
//     it once, at register_op; OutputsIntact says whether the kernel left
//     the outputs as the client described them, else the functional op
//     runs instead);
//   - an out= argument (kwarg-only Tensor(a!)) of the op called runs on a
//     resizable scratch tensor of the same shape (ReplaceOutArguments):
//     kernels such as mse_loss.out resize their out tensor as scratch
//     space, which memory over a segment cannot do; the runner copies the
//     scratch into the segment after the call.
//
// Thread safety: functions of their arguments (FindOutVariant reads the
// dispatcher's operator list, made once, on its first call).
#ifndef FLAGOS_DAEMON_OPS_OP_OUT_VARIANT_H_
#define FLAGOS_DAEMON_OPS_OP_OUT_VARIANT_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// The out= overload of functional op `op`: the same arguments (names and
// types), then one Tensor(a!) out argument per return, every return a
// plain Tensor; nullopt when there is none. (Overload names do not follow
// one pattern: add.Tensor's is add.out, sum.dim_IntList's sum.IntList_out.)
std::optional<c10::OperatorHandle> FindOutVariant(const c10::OperatorHandle& op);

// Whether every output still is the tensor the client described (sizes,
// strides, memory, no lazy conj/neg bit: linalg_lu_solve.out may set the
// conj bit of its out tensor instead of conjugating) after an out= kernel
// wrote it. `made`: each output as wrapped, with its data pointer then.
bool OutputsIntact(const v1::OpCall& call,
                   const std::vector<std::pair<at::Tensor, const void*>>& made);

// An out= argument and the resizable tensor the kernel writes instead.
struct OutArgument {
  const std::string* name;  // the schema's
  at::Tensor destination;   // over the session's segment
  at::Tensor scratch;
};

// Replaces each defined out= tensor on `stack` (decoded by `arguments`)
// with a fresh tensor of its sizes, strides and options; returns them.
std::vector<OutArgument> ReplaceOutArguments(const std::vector<c10::Argument>& arguments,
                                             torch::jit::Stack* stack);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_OUT_VARIANT_H_
