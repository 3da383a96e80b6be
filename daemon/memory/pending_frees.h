// The frees and releases (free, release_import, release_pinned) a session
// has scheduled and that have not yet taken effect. Each runs once the
// device has completed every earlier command on its device (release_pinned:
// on every device), so
//   - at out-of-memory an allocate waits for them and tries again (the
//     client already gave that memory back): WaitForNone;
//   - a sync completes only after the ones sent before it took effect
//     (docs/protocol.md, "When a sync completes"): each gets a number in
//     the order the session sent them, the sync takes Latest() when it is
//     dispatched and runs its reply through WhenDone.
// They may take effect out of order (each waits for its own set of stream
// queues): a waiter on device d waits for every pending free on d (on
// every device when d < 0) and every all-device one, numbered up to its
// mark, and for none sent after it.
//
// Thread safety: every method may be called from any thread. mu_ is a
// leaf: WhenDone's actions run after it is released (in the thread whose
// Done completed the last free they waited for, or in WhenDone's caller)
// and may call back in. WaitForNone blocks on it; it is called with the
// session's dispatch_mu_ held, which the declared order allows
// (session.h): no free needs dispatch_mu_ to execute.
#ifndef FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_
#define FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class PendingFrees {
 public:
  // One scheduled free: what Done needs back.
  struct Ticket {
    int device = -1;
    uint64_t number = 0;
  };

  // A free on `device` (-1: one that follows every device's commands, as
  // release_pinned) was scheduled.
  Ticket Add(int device);
  // It executed (whatever its outcome): its effect is visible now. Runs
  // the WhenDone actions that waited for nothing else. Once per ticket (a
  // second call does nothing).
  void Done(const Ticket& ticket);
  // Waits until no free is pending; false when none was (nothing waited
  // for, so trying again is no use).
  bool WaitForNone();

  // The number of the latest free scheduled so far (0: none yet).
  uint64_t Latest() const;
  // Runs `action` once every free numbered up to `upto` on `device` (every
  // device when device < 0), and every such all-device one, has executed:
  // now, in the calling thread, when none is pending, else in the thread
  // whose Done completes the last of them. Dropped unrun if that never
  // happens (the session closes first).
  void WhenDone(int device, uint64_t upto, std::function<void()> action);

  // Frees scheduled and not done, all devices together.
  int pending() const;

 private:
  struct Waiter {
    int device;
    uint64_t upto;
    std::function<void()> action;
  };

  // True when nothing a waiter on `device` waits for, numbered <= upto, is
  // pending.
  bool Clear(int device, uint64_t upto) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t latest_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  // The pending numbers by device (-1: the all-device ones); no empty set.
  absl::flat_hash_map<int, std::set<uint64_t>> numbers_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_PENDING_FREES_H_
