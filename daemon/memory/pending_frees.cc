#include "memory/pending_frees.h"

namespace flagos::daemon {

void PendingFrees::Add() {
  absl::MutexLock lock(&mu_);
  ++pending_;
}

void PendingFrees::Done() {
  absl::MutexLock lock(&mu_);
  --pending_;
}

bool PendingFrees::WaitForNone() {
  absl::MutexLock lock(&mu_);
  if (pending_ == 0) return false;
  mu_.Await(absl::Condition(+[](int* pending) { return *pending == 0; }, &pending_));
  return true;
}

}  // namespace flagos::daemon
