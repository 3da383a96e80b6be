// One device's health probe, through the device's real work path.
//
// An attempt is a job on the device's WorkerPool, the pool every session's
// stream queues run on. The job copies kProbeBytes of a pattern host→device
// and back on a stream of the probe's own, into a device buffer of its own
// (both made with the probe and kept: kProbeBytes of every device's memory
// are the probe's), then issues a host function (LaunchHostFunc) that
// compares the bytes read back and completes the attempt. So an attempt completes only when a worker of the pool is free to
// run it AND the device completes the work issued to it; it fails when the
// runtime reports an error or the bytes come back wrong.
//
// Waiting is bounded and never blocks a worker: Await(deadline) returns
// DEADLINE_EXCEEDED at the deadline, saying whether the attempt still waits
// for a worker (every worker of the pool is busy or stuck) or for the device
// (it has stopped completing work), and for how long. An attempt still
// outstanding is not started again: Start() returns it, so at most one
// attempt per device is in flight and a stuck device stays unhealthy, the
// time it has been stuck growing.
//
// Thread safety: every method may be called from any thread. Attempt is
// immutable apart from its outcome, which is set once.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_DEVICE_PROBE_H_
#define FLAGOS_DAEMON_OBSERVABILITY_DEVICE_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "execution/worker_pool.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

class DeviceProbe {
 public:
  // One probe of one device: queued on the pool, then issued to the
  // device, then done.
  class Attempt {
   public:
    int device() const { return device_; }
    // Whether the outcome is known.
    bool done() const;
    // Blocks until done or `deadline`; returns done().
    bool WaitUntil(absl::Time deadline) const;
    // OK: the device ran the work and the bytes came back as written.
    // UNAVAILABLE (the runtime's error), DATA_LOSS (wrong bytes) or
    // CANCELLED (the probe or the pool stopped before it ran).
    // REQUIRES: done().
    absl::Status status() const;
    // DEADLINE_EXCEEDED naming the device, what the attempt waits for (a
    // worker, or the device) and since when, as of `now`.
    // REQUIRES: !done().
    absl::Status Outstanding(absl::Time now) const;

   private:
    friend class DeviceProbe;
    Attempt(int device, std::string backend, int workers, uint64_t sequence)
        : device_(device), backend_(std::move(backend)), workers_(workers),
          sequence_(sequence), queued_at_(absl::Now()) {}
    // The job started issuing the work.
    void MarkIssued();
    bool issued() const;
    // Sets the outcome; a later call changes nothing.
    void Finish(absl::Status status);

    const int device_;
    const std::string backend_;
    const int workers_;
    const uint64_t sequence_;  // 1, 2, ...: picks the pattern
    const absl::Time queued_at_;
    mutable absl::Mutex mu_;
    absl::Time issued_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
    bool done_ ABSL_GUARDED_BY(mu_) = false;
    absl::Status status_ ABSL_GUARDED_BY(mu_);
  };

  // Bytes copied to the device and back by each attempt.
  static constexpr uint64_t kProbeBytes = 64;

  // Creates the probe's stream and its kProbeBytes device buffer on
  // `device`. When the runtime refuses, that is logged and every attempt
  // tries again first, failing (UNAVAILABLE, naming the device) until one
  // succeeds.
  // REQUIRES: `runtime` outlives the probe and every job it schedules;
  // `pool` (the device's) outlives the probe.
  DeviceProbe(DeviceRuntime* runtime, int device, WorkerPool* pool);
  // Frees the stream and the buffer, unless an attempt is outstanding:
  // then the device may still use them, and they are left to the runtime
  // (logged when the device holds its work). An attempt still queued is
  // cancelled when its job runs.
  ~DeviceProbe();

  DeviceProbe(const DeviceProbe&) = delete;
  DeviceProbe& operator=(const DeviceProbe&) = delete;

  // Starts an attempt (schedules its job on the pool) unless the current
  // one is outstanding; returns the current attempt.
  std::shared_ptr<const Attempt> Start();
  // The current attempt's outcome by `deadline`: its status() when done,
  // else Outstanding(). OK when no attempt was ever started.
  absl::Status Await(absl::Time deadline) const;
  int device() const { return device_; }

 private:
  // What jobs and host functions share with the probe; outlives it while
  // an attempt holds it.
  struct Core;

  // The job of `attempt`, on a worker of the pool.
  static void Run(const std::shared_ptr<Core>& core, const std::shared_ptr<Attempt>& attempt);

  const int device_;
  WorkerPool* const pool_;
  const std::shared_ptr<Core> core_;
  mutable absl::Mutex mu_;
  std::shared_ptr<Attempt> current_ ABSL_GUARDED_BY(mu_);
  uint64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_DEVICE_PROBE_H_
