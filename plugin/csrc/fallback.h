// The boxed fallback (fallback.cpp), callable by explicit kernels that
// reroute an operator to another one the daemon can run.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl {

// Runs `op` on flagos: arguments on `stack` in, returns out.
void RunOnDaemon(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_fl
