// Bounds a SIGTERM shutdown that a stuck device would keep from finishing.
//
// Shutting down waits for the device: closing a session synchronises its
// streams before it frees memory, and the runtime waits for every stream
// when it is destroyed. A device that stopped completing work (or a worker
// pool whose every worker is stuck) would make that wait last forever. At
// SIGTERM the daemon starts a health probe on every device
// (HealthCheck::StartDeviceProbes) and hands the attempts still outstanding
// to this guard, from a thread of its own: if the shutdown has not finished
// `grace` later and one of them is still outstanding, the guard logs what
// each still waits for, says so on STATUS=, and ends the process with
// _exit(kStalledShutdownExitCode), without destructors (they would wait for
// the device) and without freeing device memory (the driver reclaims it
// with the process). When every attempt completed, the shutdown goes on
// for as long as it takes, as without the guard.
//
// Part of the flagosd binary (libsystemd). Thread safety: constructed and
// destroyed by one thread; Finish from any.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_STALLED_SHUTDOWN_GUARD_H_
#define FLAGOS_DAEMON_OBSERVABILITY_STALLED_SHUTDOWN_GUARD_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "observability/device_probe.h"

namespace flagos::daemon {

// The exit status of a shutdown a stuck device kept from finishing.
inline constexpr int kStalledShutdownExitCode = 1;

class StalledShutdownGuard {
 public:
  StalledShutdownGuard(std::vector<std::shared_ptr<const DeviceProbe::Attempt>> attempts,
                       absl::Duration grace);
  // Finish(), then joins the thread.
  ~StalledShutdownGuard();

  StalledShutdownGuard(const StalledShutdownGuard&) = delete;
  StalledShutdownGuard& operator=(const StalledShutdownGuard&) = delete;

  // The shutdown finished: the guard ends nothing.
  void Finish();

 private:
  void Run(absl::Time deadline);

  const std::vector<std::shared_ptr<const DeviceProbe::Attempt>> attempts_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_STALLED_SHUTDOWN_GUARD_H_
