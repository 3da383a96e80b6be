// flagosd's side of systemd supervision, from a thread of its own:
//   - when the unit sets WatchdogSec (WATCHDOG_USEC in the environment),
//     WATCHDOG=1 every half period, each sent only after a health check
//     (HealthCheck: each device completes work issued from its sessions'
//     worker pool, and the listener answers) passed, so systemd restarts a
//     daemon that is alive but wedged;
//   - STATUS= lines with devices and sessions, or what is unhealthy;
//   - a failed check is logged (once per change) and counted in
//     flagosd_health_check_failures_total.
// Without systemd (no NOTIFY_SOCKET) the checks still run, every 5 s, for
// the log and the metric.
//
// Thread safety: constructed and destroyed by one thread.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_WATCHDOG_H_
#define FLAGOS_DAEMON_OBSERVABILITY_WATCHDOG_H_

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/server.h"

namespace flagos::daemon {

class Watchdog {
 public:
  // `devices`: the "2 devices (cpu)" part of the status line. `server`
  // must outlive the watchdog.
  Watchdog(Server* server, std::string devices);
  // Stop(), then joins the thread (at most one health check's timeout
  // later).
  ~Watchdog();
  // Asks the thread to stop, without waiting: it sends and logs nothing
  // more (call before shutting the server down). Any thread.
  void Stop();

  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The watchdog period systemd asked for; zero when none.
  absl::Duration period() const { return period_; }

 private:
  void Run();

  Server* const server_;
  const std::string devices_;
  absl::Duration period_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_WATCHDOG_H_
