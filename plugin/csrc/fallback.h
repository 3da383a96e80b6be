// The boxed fallback (fallback.cpp), callable by explicit kernels that
// reroute an operator to another one the daemon can run.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include "op_schema.h"

namespace torch_fl {

// Runs `op` on flagos: arguments on `stack` in, returns out.
void RunOnDaemon(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The same with `op`'s traits (TraitsOf) at hand.
void RunOnDaemon(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack);

// The same for an explicit (unboxed) kernel, without a stack: `args` (all of
// the schema's, in order) may hold tensors borrowed from the kernel's own
// arguments (c10::MaybeOwnedTraits<c10::IValue>::createBorrow), of which
// the asynchronous path makes no copies. `results` gets one value per
// return; a return that is a written argument is None there (the kernel
// returns that argument itself).
void RunOnDaemonUnboxed(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                        c10::SmallVectorImpl<c10::IValue>* results);

}  // namespace torch_fl
