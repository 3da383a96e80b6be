#include "observability/stalled_shutdown_guard.h"

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "logging.h"

namespace flagos::daemon {

StalledShutdownGuard::StalledShutdownGuard(
    std::vector<std::shared_ptr<const DeviceProbe::Attempt>> attempts, absl::Duration grace)
    : attempts_(std::move(attempts)) {
  thread_ = std::thread(&StalledShutdownGuard::Run, this, absl::Now() + grace);
}

StalledShutdownGuard::~StalledShutdownGuard() {
  Finish();
  thread_.join();
}

void StalledShutdownGuard::Finish() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
}

void StalledShutdownGuard::Run(absl::Time deadline) {
  if (attempts_.empty()) return;  // every device answered at once
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&finished_), deadline)) return;
  }
  const absl::Time now = absl::Now();
  std::vector<std::string> stuck;
  for (const auto& attempt : attempts_) {
    if (!attempt->done()) stuck.emplace_back(attempt->Outstanding(now).message());
  }
  if (stuck.empty()) return;  // the devices work: the shutdown is only slow
  const std::string message = absl::StrCat(
      "shutdown cannot finish: ", absl::StrJoin(stuck, "; "),
      "; exiting now with status ", kStalledShutdownExitCode,
      " without waiting for the device or freeing its memory (the driver reclaims it when the "
      "process ends)");
  LogError(message);
  sd_notify(0, absl::StrCat("STATUS=stopping: ", message).c_str());
  _exit(kStalledShutdownExitCode);
}

}  // namespace flagos::daemon
