#include "observability/metrics_endpoint.h"

#include <sys/resource.h>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <exception>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collectives/communicators.h"
#include "collectives/groups_between_daemons.h"
#include "transport/flagos_service.h"
#include "sessions/session_registry.h"

namespace flagos::daemon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void Add(MetricFamily& family, double value,
         std::vector<std::pair<std::string, std::string>> labels = {}) {
  ClientMetric metric;
  for (auto& [name, label_value] : labels) {
    metric.label.push_back(ClientMetric::Label{std::move(name), std::move(label_value)});
  }
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

template <typename T>
std::optional<double> AsDouble(const std::optional<T>& v) {
  return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
}

struct TelemetryMetric {
  const char* name;
  const char* help;
  std::optional<double> (*value)(const DeviceTelemetry&);
};

constexpr TelemetryMetric kTelemetry[] = {
    {"flagosd_device_temperature_celsius",
     "Device temperature as its management library reports it.",
     [](const DeviceTelemetry& t) { return t.temperature_celsius; }},
    {"flagosd_device_power_watts", "Device power draw as its management library reports it.",
     [](const DeviceTelemetry& t) { return t.power_watts; }},
    {"flagosd_device_utilization_ratio",
     "Fraction of the last sample period in which kernels ran, as the device's management "
     "library reports it.",
     [](const DeviceTelemetry& t) { return t.utilization; }},
    {"flagosd_device_reported_memory_total_bytes",
     "Device memory as its management library reports it.",
     [](const DeviceTelemetry& t) { return AsDouble(t.memory_total_bytes); }},
    {"flagosd_device_reported_memory_used_bytes",
     "Device memory in use as its management library reports it (all processes).",
     [](const DeviceTelemetry& t) { return AsDouble(t.memory_used_bytes); }},
};

}  // namespace

// Reads live state at each scrape, then appends the registry's counters.
class MetricsEndpoint::LiveState final : public prometheus::Collectable {
 public:
  LiveState(const Backend& backend, const SessionRegistry& sessions,
            const DeviceActivity& activity, const Metrics& metrics, double start_time_unix)
      : backend_(backend),
        sessions_(sessions),
        activity_(activity),
        metrics_(metrics),
        start_time_(start_time_unix) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    MetricFamily build = Family("flagosd_build_info",
                                "Always 1; the labels say which flagosd this is.",
                                MetricType::Gauge);
    Add(build, 1,
        {{"version", kDaemonVersion}, {"backend", backend_.name()},
         {"torch_version", TorchVersion()}});
    out.push_back(std::move(build));
    MetricFamily native = Family(
        "flagosd_native_route_available",
        "1 when the backend has native kernels (the cpu backend's ATen CPU, kunlunxin's "
        "xdnn_pytorch binding module); 0 when every operator takes cpu_fallback.",
        MetricType::Gauge);
    Add(native, backend_.native_description().empty() ? 0 : 1, {{"backend", backend_.name()}});
    out.push_back(std::move(native));
    // The daemon's own CPU time (all its threads), as getrusage reports it:
    // what serving costs the node, per op when divided by flagosd_ops_total.
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) == 0) {
      const auto seconds = [](const timeval& t) {
        return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
      };
      MetricFamily cpu = Family("flagosd_cpu_seconds_total",
                                "CPU time flagosd's threads used since it started, user and "
                                "system.",
                                MetricType::Counter);
      Add(cpu, seconds(usage.ru_utime), {{"mode", "user"}});
      Add(cpu, seconds(usage.ru_stime), {{"mode", "system"}});
      out.push_back(std::move(cpu));
    }
    MetricFamily start = Family("flagosd_start_time_seconds",
                                "When this flagosd started, in seconds since the epoch.",
                                MetricType::Gauge);
    Add(start, start_time_);
    out.push_back(std::move(start));

    const std::vector<std::shared_ptr<Session>> sessions = sessions_.Snapshot();
    // Whose client left while a command of theirs ran: they hold their
    // segments until it returned.
    const std::vector<std::shared_ptr<Session>> closing = sessions_.Closing();
    const DeviceRuntime& runtime = backend_.runtime();
    MetricFamily total = Family("flagosd_device_memory_total_bytes",
                                "Memory of the device.", MetricType::Gauge);
    MetricFamily used = Family("flagosd_device_memory_used_bytes",
                               "Device memory held by the segments of live and closing sessions.",
                               MetricType::Gauge);
    MetricFamily reserved = Family(
        "flagosd_device_memory_reserved_bytes",
        "Device memory in use as the runtime reports it (total minus free): segments and "
        "whatever else the runtime or other processes hold.",
        MetricType::Gauge);
    MetricFamily busy = Family(
        "flagosd_device_busy_seconds_total",
        "Time the device's queues spent executing commands (one or more streams at once "
        "count once; on an asynchronous device, issuing them). Utilisation is its rate.",
        MetricType::Counter);
    // The vendor's figures: one family per DeviceTelemetry field.
    MetricFamily vendor[std::size(kTelemetry)];
    for (size_t i = 0; i < std::size(kTelemetry); ++i) {
      vendor[i] = Family(kTelemetry[i].name, kTelemetry[i].help, MetricType::Gauge);
    }
    const bool telemetry = runtime.capabilities().Has(Slot::kDeviceTelemetry);
    for (int d = 0; d < runtime.DeviceCount(); ++d) {
      const std::string index = absl::StrCat(d);
      if (absl::StatusOr<DeviceProperties> properties = runtime.GetDeviceProperties(d);
          properties.ok()) {
        Add(total, static_cast<double>(properties->total_memory), {{"device", index}});
      }
      uint64_t bytes = 0;
      for (const auto& session : sessions) bytes += session->device_bytes(d);
      for (const auto& session : closing) bytes += session->device_bytes(d);
      Add(used, static_cast<double>(bytes), {{"device", index}});
      if (absl::StatusOr<MemoryInfo> info = runtime.GetMemoryInfo(d); info.ok()) {
        Add(reserved, static_cast<double>(info->total_bytes - std::min(info->free_bytes,
                                                                       info->total_bytes)),
            {{"device", index}});
      }
      Add(busy, activity_.busy_seconds(d), {{"device", index}});
      if (!telemetry) continue;
      absl::StatusOr<DeviceTelemetry> t = runtime.GetTelemetry(d);
      if (!t.ok()) continue;
      for (size_t i = 0; i < std::size(kTelemetry); ++i) {
        if (std::optional<double> v = kTelemetry[i].value(*t)) {
          Add(vendor[i], *v, {{"device", index}});
        }
      }
    }
    // A family with no samples (no telemetry here) is left out whole.
    const auto keep = [&out](MetricFamily& family) {
      if (!family.metric.empty()) out.push_back(std::move(family));
    };
    for (MetricFamily* family : {&total, &used, &reserved, &busy}) keep(*family);
    for (MetricFamily& family : vendor) keep(family);

    MetricFamily live = Family("flagosd_sessions", "Client sessions live now.", MetricType::Gauge);
    Add(live, static_cast<double>(sessions.size()));
    out.push_back(std::move(live));
    // Shared memory mapped for live sessions, summed over them.
    const auto mapped = [&](const char* name, const char* help, auto bytes_of) {
      uint64_t total = 0;
      for (const auto& session : sessions) total += bytes_of(*session);
      MetricFamily family = Family(name, help, MetricType::Gauge);
      Add(family, static_cast<double>(total));
      out.push_back(std::move(family));
    };
    mapped("flagosd_staging_bytes", "Shared-memory staging regions mapped for live sessions.",
           [](const Session& s) { return s.staging_bytes(); });
    mapped("flagosd_pinned_bytes", "Pinned host memory regions mapped for live sessions.",
           [](const Session& s) { return s.pinned_bytes(); });

    // Collectives of the communicators this daemon's sessions formed.
    const CollectiveCounts collectives = Communicators::Get().counts();
    const auto one = [&out](const char* name, const char* help, MetricType type, uint64_t v) {
      MetricFamily family = Family(name, help, type);
      Add(family, static_cast<double>(v));
      out.push_back(std::move(family));
    };
    one("flagosd_collectives_total",
        "Collectives completed (one per collective of a process group, not per rank).",
        MetricType::Counter, collectives.collectives);
    one("flagosd_collectives_by_library_total",
        "Of flagosd_collectives_total, those the backend's collective library ran over device "
        "memory (BKCL on kunlunxin); the others ran on flagosd's own threads.",
        MetricType::Counter, collectives.by_library);
    one("flagosd_collective_bytes_total",
        "Bytes the ranks of completed collectives contributed (each rank's input).",
        MetricType::Counter, collectives.bytes);
    one("flagosd_collective_failures_total",
        "Collectives that ended in an error (a rank missing past the timeout, sizes that differ).",
        MetricType::Counter, collectives.failed);
    one("flagosd_communicators", "Communicators of torch.distributed process groups alive now.",
        MetricType::Gauge, collectives.communicators);
    // Collectives of this daemon's ranks in groups that span daemons (gloo).
    const BetweenDaemonsCounts between = GroupsBetweenDaemons::Get().counts();
    one("flagosd_collectives_between_daemons_total",
        "Collectives this daemon's ranks completed in process groups that span daemons, through "
        "gloo between the daemons (one per rank: a group's collective counts on each rank's "
        "daemon).",
        MetricType::Counter, between.collectives);
    one("flagosd_collective_between_daemons_bytes_total",
        "Bytes this daemon's ranks gave to the collectives of flagosd_collectives_between_daemons_total.",
        MetricType::Counter, between.bytes);
    one("flagosd_collective_between_daemons_failures_total",
        "Collectives of this daemon's ranks in groups that span daemons that ended in an error (a "
        "peer gone, the timeout, calls that differ).",
        MetricType::Counter, between.failed);
    one("flagosd_ranks_between_daemons",
        "Ranks this daemon's sessions hold now in process groups that span daemons.",
        MetricType::Gauge, between.ranks);

    for (MetricFamily& family : metrics_.registry()->Collect()) out.push_back(std::move(family));
    return out;
  }

 private:
  const Backend& backend_;
  const SessionRegistry& sessions_;
  const DeviceActivity& activity_;
  const Metrics& metrics_;
  const double start_time_;
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, const Backend& backend, const SessionRegistry& sessions,
    const DeviceActivity& activity, const Metrics& metrics, double start_time_unix) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen='", address,
        "' is not host:port (for example 127.0.0.1:9400 or [::1]:9400; empty disables metrics)"));
  }
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->live_ =
      std::make_shared<LiveState>(backend, sessions, activity, metrics, start_time_unix);
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve metrics on ", address, " (--metrics-listen): ", e.what(),
        "; is the port in use by another flagosd? pick another port, or pass "
        "--metrics-listen= to disable metrics"));
  }
  endpoint->exposer_->RegisterCollectable(endpoint->live_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  const std::string host = address.substr(0, colon);
  endpoint->url_ = absl::StrCat("http://", host, ":", ports.empty() ? port : ports.front(),
                                "/metrics");
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace flagos::daemon
