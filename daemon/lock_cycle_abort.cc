// Compiled into every executable that links flagosd_base (flagosd and every
// test) in the sanitizer builds only (FLAGOS_SANITIZE, FLAGOS_TSAN;
// daemon/CMakeLists.txt): absl::Mutex then aborts the process the first time
// it sees two mutexes taken in an order that closes a cycle in the order seen
// so far (a potential deadlock, whether or not the threads met), printing
// both stacks. The order the code declares (ABSL_ACQUIRED_BEFORE/AFTER beside
// each mutex, e.g. daemon/sessions/session.h) is the one it must keep.
// The normal build leaves absl's default (off in optimised builds): the
// check records every acquisition and costs more than the lock itself.
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {
namespace {

const bool kAbortOnLockCycle = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  return true;
}();

}  // namespace
}  // namespace flagos::daemon
