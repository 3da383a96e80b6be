// Whether flagosd can still serve: each device's queue runs a probe that
// calls into the device runtime, and the gRPC listener answers a
// Negotiate, each within a deadline. The systemd watchdog (watchdog.h)
// sends WATCHDOG=1 only after a passing check, so a daemon whose device or
// listener is wedged stops being kept alive and systemd restarts it.
//
// A probe that does not finish in time is not queued again until it does:
// the device stays unhealthy, with how long it has been stuck in the error.
//
// Thread safety: Check is called by one thread at a time (the watchdog);
// Release may be called from any thread.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_
#define FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "execution/backend.h"
#include "grpcpp/channel.h"
#include "execution/stream_queue.h"
#include "execution/worker_pool.h"

namespace flagos::daemon {

class HealthCheck {
 public:
  // Makes a new channel to the listener the check calls Negotiate on.
  using Connect = std::function<std::shared_ptr<grpc::Channel>()>;

  // `endpoint` names the listener `connect` reaches (one the server listens
  // on). `wedge_after`: for tests, each device probe started that long
  // after construction blocks until Release() (a wedged device queue);
  // InfiniteDuration() in production. `backend` must outlive the check.
  HealthCheck(const Backend& backend, std::string endpoint, Connect connect,
              absl::Duration wedge_after);
  // Release(), then joins the probe queues.
  ~HealthCheck();

  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  // OK when every device probe and the listener answered within `timeout`;
  // else UNAVAILABLE naming what did not answer.
  absl::Status Check(absl::Duration timeout);
  // Unblocks wedged probes (at shutdown). Idempotent.
  void Release() {
    absl::MutexLock lock(&release_mu_);
    released_ = true;
  }

 private:
  struct Probe {
    absl::Notification done;
    absl::Status status;  // written before `done`
    absl::Time started;
  };
  absl::Status CheckListener(absl::Duration timeout);

  const Backend& backend_;
  const std::string endpoint_;
  const Connect connect_;
  const absl::Time wedge_at_;
  absl::Mutex release_mu_;
  bool released_ ABSL_GUARDED_BY(release_mu_) = false;
  // One worker per device, apart from the sessions' pools, so that a probe
  // measures the runtime, not how busy the sessions keep their workers; at
  // most one probe per device is queued, so a wedged one holds one worker.
  WorkerPool pool_;
  // Per device: its probe queue and the probe last queued on it.
  std::vector<std::unique_ptr<StreamQueue>> queues_;
  std::vector<std::shared_ptr<Probe>> probes_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_
