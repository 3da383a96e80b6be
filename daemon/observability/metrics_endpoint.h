// The /metrics endpoint: an HTTP listener (prometheus-cpp's Exposer) that
// serves the registry of Metrics and, read at each scrape, the figures of
// live state: build info and start time, each device's memory (total, used
// by segments, reserved as the runtime reports it), busy seconds, the
// vendor's telemetry where the backend has it (absent otherwise, never
// invented), sessions and staging memory.
//
// Thread safety: scrapes run on the exposer's threads, concurrently with
// everything; what they read is internally synchronised.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_METRICS_ENDPOINT_H_
#define FLAGOS_DAEMON_OBSERVABILITY_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "execution/backend.h"
#include "execution/device_activity.h"
#include "observability/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace flagos::daemon {

class SessionRegistry;

class MetricsEndpoint {
 public:
  // Listens on `address` (host:port; port 0 picks a free one).
  // INVALID_ARGUMENT naming the address when it cannot be listened on.
  // Everything passed must outlive the endpoint.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, const Backend& backend, const SessionRegistry& sessions,
      const DeviceActivity& activity, const Metrics& metrics, double start_time_unix);
  ~MetricsEndpoint();

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // "http://127.0.0.1:9400/metrics", with the port listened on.
  const std::string& url() const { return url_; }

 private:
  class LiveState;
  MetricsEndpoint() = default;

  std::shared_ptr<LiveState> live_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_METRICS_ENDPOINT_H_
