// The frees (free, release_import) a session has scheduled and not yet
// executed: each runs once the device has completed every earlier command
// on it, so at out-of-memory an allocate waits for them and tries again
// (the client already gave that memory back).
//
// Thread safety: every method may be called from any thread. mu_ is a
// leaf. WaitForNone blocks on it; it is called with the session's
// dispatch_mu_ held, which the declared order allows (session.h): no free
// needs dispatch_mu_ to execute.
#ifndef FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_
#define FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class PendingFrees {
 public:
  // A free was scheduled.
  void Add();
  // A scheduled free executed.
  void Done();
  // Waits until no free is pending; false when none was (nothing waited
  // for, so trying again is no use).
  bool WaitForNone();

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_
