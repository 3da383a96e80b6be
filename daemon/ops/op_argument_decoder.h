// Decodes an OpCall's arguments into a boxed stack by the op's schema (the
// decoding table is op_runner.h's): each Value is checked against its
// argument's type, tensors are wrapped over the memory they name through
// the call's context (range-checked first), enum arguments must name a
// value of their enum, and missing trailing arguments take the schema's
// defaults. Errors are INVALID_ARGUMENT (UNIMPLEMENTED for a type flagosd
// cannot decode) naming the op and the argument.
//
// Thread safety: a function of its arguments; the context is the calling
// thread's.
#ifndef FLAGOS_DAEMON_OPS_OP_ARGUMENT_DECODER_H_
#define FLAGOS_DAEMON_OPS_OP_ARGUMENT_DECODER_H_

#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

#include <vector>

#include "absl/status/status.h"
#include "flagos/v1/flagos.pb.h"
#include "ops/op_call_context.h"

namespace flagos::daemon {

// Pushes one IValue per schema argument onto `stack`. Arguments the kernel
// writes (Tensor(a!)) are wrapped as written (OpCallContext::set_writing);
// the context is left not writing.
absl::Status DecodeArguments(OpCallContext& context, const std::vector<c10::Argument>& arguments,
                             const v1::OpCall& call, torch::jit::Stack* stack);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_ARGUMENT_DECODER_H_
