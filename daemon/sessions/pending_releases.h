// The frees and releases of one session (free, release_import,
// release_pinned) that are scheduled and have not yet taken effect,
// numbered in the order the session sent them, so that a sync completes
// only after the ones sent before it (docs/protocol.md, "When a sync
// completes") and an allocate can wait for all of them before it reports
// out-of-memory.
//
// A release belongs to one device, or to every device (release_pinned:
// device -1). They may take effect out of order (each waits for its own
// set of stream queues); a waiter waits for every release on its device
// (every device for -1), and every all-device release, scheduled before it.
//
// Thread safety: every method may be called from any thread. Actions run
// with no lock of this class held, in the thread that calls Done (or
// WhenDone, when nothing is pending), and may call back in.
#ifndef FLAGOS_DAEMON_SESSIONS_PENDING_RELEASES_H_
#define FLAGOS_DAEMON_SESSIONS_PENDING_RELEASES_H_

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class PendingReleases {
 public:
  // One scheduled release: what Done needs back.
  struct Ticket {
    int device = -1;
    uint64_t number = 0;
  };

  // `devices`: the backend's device count (valid devices are 0..devices-1).
  explicit PendingReleases(int devices);

  PendingReleases(const PendingReleases&) = delete;
  PendingReleases& operator=(const PendingReleases&) = delete;

  // A release on `device` (-1: every device) is scheduled.
  // REQUIRES: -1 <= device < devices.
  Ticket Schedule(int device);
  // Its effect is visible now (it ran, whatever its outcome); runs the
  // actions that waited for nothing else.
  void Done(const Ticket& ticket);

  // The number of the latest release scheduled so far (0: none yet): what
  // a command that must follow the releases sent before it waits for,
  // taken when it is dispatched.
  uint64_t Latest() const;
  // Runs `action` once every release numbered up to `upto` on `device`
  // (every device when device < 0), and every such all-device one, has
  // taken effect: now, in the calling thread, when none is pending, else in
  // the thread whose Done completes the last of them. Dropped unrun if that
  // never happens (the session closes first).
  void WhenDone(int device, uint64_t upto, std::function<void()> action);

  // Releases scheduled and not done, all devices together.
  int pending() const;
  // Blocks until none is pending (allocate, before it reports
  // out-of-memory: a pending free may give back what it needs).
  // REQUIRES: the caller holds nothing a scheduled release needs to run.
  void AwaitNonePending() const;

 private:
  struct Waiter {
    int device;
    uint64_t upto;  // waits for every matching release numbered <= upto
    std::function<void()> action;
  };

  // True when no release a waiter on `device` waits for, numbered <= upto,
  // is pending.
  bool Clear(int device, uint64_t upto) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pending numbers of `device` (-1: the all-device ones).
  std::set<uint64_t>& Numbers(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_[device + 1];
  }

  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  // Index 0: all-device releases; index d + 1: device d's.
  std::vector<std::set<uint64_t>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_PENDING_RELEASES_H_
