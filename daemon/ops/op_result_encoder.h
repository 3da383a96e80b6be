// Hands an op's returns back to the client, by the rules of op_runner.h:
// a return that aliases a written argument (Tensor(a!)) was written in
// place; other tensor returns are copied into the call's `outputs` (sizes
// must match, the client's shape inference said what they would be);
// with want_values the completion carries one Value per schema return
// (non-tensor returns, tensors by value as host_tensor, or kept as `held`
// when the context holds results, none for those the client holds).
// Errors name the op and the return or output.
//
// Thread safety: functions of their arguments; the context is the calling
// thread's.
#ifndef FLAGOS_DAEMON_OPS_OP_RESULT_ENCODER_H_
#define FLAGOS_DAEMON_OPS_OP_RESULT_ENCODER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

#include "absl/status/status.h"
#include "flagos/v1/flagos.pb.h"
#include "ops/op_call_context.h"
#include "ops/op_error_context.h"

namespace flagos::daemon {

// Handles the returns the call left on `stack` (one per schema return):
// copies them into `call.outputs()` and/or adds them to
// `completion->values`.
absl::Status TakeReturns(OpCallContext& context, const c10::FunctionSchema& schema,
                         const v1::OpCall& call, torch::jit::Stack* stack,
                         v1::Completion* completion);

// Copies `result` into `destination` (a tensor over the session's memory)
// with the route's copy kernel; INVALID_ARGUMENT naming `where` when their
// sizes differ.
absl::Status CopyInto(OpCallContext& context, const at::Tensor& destination,
                      const at::Tensor& result, const ValueWhere& where);

// `tensor` (a host tensor; undefined: none) by value, as contiguous bytes,
// in `out`.
absl::Status EncodeByValue(OpCallContext& context, const at::Tensor& tensor, v1::Value* out);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_RESULT_ENCODER_H_
