// The boxed fallback (fallback.cpp), callable by explicit kernels that
// reroute an operator to another one the daemon can run.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl {

// Runs `op` on flagos: arguments on `stack` in, returns out.
void RunOnDaemon(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Operators with a CPU kernel whose PrivateUse1 entry would otherwise be a
// CompositeExplicitAutograd default (a decomposition, or a functional
// wrapper around the out= variant) are forwarded as themselves, so the
// daemon runs the backend's own kernel: the same values as that kernel
// (fused, with its accumulation types) and one command instead of several.
// Registered once, at import; returns how many operators it covers.
int ForwardOpsWithCpuKernels();

}  // namespace torch_fl
