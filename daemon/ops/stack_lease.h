// The boxed stack of a call: one vector per thread, reused (no allocation
// per call), emptied when the call is over. A nested call on the thread
// (none is expected) gets a stack of its own.
//
// Header only.
//
// Thread safety: a lease is used by the thread that made it.
#ifndef FLAGOS_DAEMON_OPS_STACK_LEASE_H_
#define FLAGOS_DAEMON_OPS_STACK_LEASE_H_

#include <ATen/core/stack.h>

namespace flagos::daemon {

class StackLease {
 public:
  StackLease() : stack_(Acquire()) { stack_.clear(); }
  ~StackLease() {
    stack_.clear();
    if (&stack_ == &Shared()) InUse() = false;
  }
  StackLease(const StackLease&) = delete;
  StackLease& operator=(const StackLease&) = delete;
  torch::jit::Stack& get() { return stack_; }

 private:
  static torch::jit::Stack& Shared() {
    thread_local torch::jit::Stack stack;
    return stack;
  }
  static bool& InUse() {
    thread_local bool in_use = false;
    return in_use;
  }
  torch::jit::Stack& Acquire() {
    if (InUse()) return own_;
    InUse() = true;
    return Shared();
  }

  torch::jit::Stack own_;
  torch::jit::Stack& stack_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_STACK_LEASE_H_
