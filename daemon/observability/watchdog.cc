#include "observability/watchdog.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "logging.h"
#include "observability/health_check.h"
#include "observability/metrics.h"

namespace flagos::daemon {

Watchdog::Watchdog(Server* server, std::string devices)
    : server_(server), devices_(std::move(devices)), period_(absl::ZeroDuration()) {
  uint64_t usec = 0;
  // > 0 when WATCHDOG_USEC is set (and WATCHDOG_PID, if set, is ours).
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    period_ = absl::Microseconds(static_cast<int64_t>(usec));
    LogInfo(absl::StrCat("systemd watchdog: every ", absl::FormatDuration(period_),
                         "; WATCHDOG=1 sent every ", absl::FormatDuration(period_ / 2),
                         " after a passing health check"));
  }
  thread_ = std::thread(&Watchdog::Run, this);
}

Watchdog::~Watchdog() {
  Stop();
  thread_.join();
}

void Watchdog::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void Watchdog::Run() {
  const bool watchdog = period_ > absl::ZeroDuration();
  const absl::Duration interval = watchdog ? period_ / 2 : absl::Seconds(5);
  // A check may take at most half the interval, so a passing one is sent
  // well before systemd's deadline.
  const absl::Duration timeout = std::min(interval / 2, absl::Seconds(10));
  std::string last_status;
  absl::Status last_health = absl::OkStatus();
  while (true) {
    const absl::Time started = absl::Now();
    const absl::Status health = server_->health_check().Check(timeout);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;  // the server may be shutting down: say nothing
    }
    std::string status;
    if (health.ok()) {
      if (watchdog) sd_notify(0, "WATCHDOG=1");
      const size_t sessions = server_->session_count();
      status = absl::StrCat("serving ", devices_, ", ", sessions,
                            sessions == 1 ? " session" : " sessions");
      if (!last_health.ok()) LogInfo("health check passes again");
    } else {
      if (Metrics* metrics = server_->metrics()) metrics->CountHealthCheckFailure();
      status = absl::StrCat("unhealthy: ", health.message());
      if (last_health.ok() || last_health.message() != health.message()) {
        LogError(absl::StrCat("health check failed: ", health.message(),
                              watchdog ? "; withholding WATCHDOG=1 (systemd restarts flagosd "
                                         "when its watchdog period passes)"
                                       : ""));
      }
    }
    last_health = health;
    if (status != last_status) {
      sd_notify(0, absl::StrCat("STATUS=", status).c_str());
      last_status = std::move(status);
    }
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), started + interval)) return;
  }
}

}  // namespace flagos::daemon
