// flagosd's Prometheus metrics, kept with prometheus-cpp: the counters and
// histograms the command path updates (once per command, never per byte),
// in one registry. Figures that describe live state (memory in use,
// sessions, staging, busy time, vendor telemetry) are not kept here: the
// metrics endpoint reads them at scrape time (metrics_endpoint.h).
//
// Names are under flagosd_, in base units; the only labels are bounded
// ones: device (an index), route, direction, code
// (docs/operations.md lists every metric).
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_METRICS_H_
#define FLAGOS_DAEMON_OBSERVABILITY_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ops/op_routes.h"

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace flagos::daemon {

enum class CopyDirection { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// The counters of one device.
class DeviceMetrics {
 public:
  // An op call on `route` that took `seconds` in the daemon (on an
  // asynchronous device: to issue) and failed unless `ok`.
  void CountOp(OpRoute route, double seconds, bool ok);
  // `ops` native op calls of a graph replay, run as prepared
  // (ops/prepared_op_call.h), that took `seconds` together: counted as
  // `ops` calls of their mean duration, not timed one by one (two clock
  // reads per op would cost more than such a call's own bookkeeping).
  void CountPreparedOps(uint64_t ops, double seconds);
  // An eager op call the session ran as its prepared copy of the same call
  // sent before (sessions/repeated_op_calls.h); counted by CountOp too.
  void CountRepeatedOp();
  void CountCopy(CopyDirection direction, uint64_t bytes);
  // Bytes the cpu_fallback route copied for one op call, each way.
  void CountCpuFallbackBytes(uint64_t to_host, uint64_t to_device);
  // A call the native kernels declined, run again on cpu_fallback.
  void CountNativeDeclined();
  void CountAllocation(uint64_t bytes);
  void CountOutOfMemory();

 private:
  friend class Metrics;
  prometheus::Counter* ops_[2] = {};
  prometheus::Counter* op_errors_ = nullptr;
  prometheus::Histogram* op_duration_ = nullptr;
  prometheus::Counter* copy_bytes_[3] = {};
  prometheus::Counter* fallback_bytes_[2] = {};
  prometheus::Counter* native_declined_ = nullptr;
  prometheus::Counter* repeated_ops_ = nullptr;
  prometheus::Counter* allocations_ = nullptr;
  prometheus::Counter* allocated_bytes_ = nullptr;
  prometheus::Counter* out_of_memory_ = nullptr;
};

class Metrics {
 public:
  // Registers every family, with a child for each of `devices` devices.
  explicit Metrics(int devices);
  ~Metrics();

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The counters of `device`, or null for an index out of range.
  DeviceMetrics* device(int device) {
    return device >= 0 && device < static_cast<int>(devices_.size()) ? devices_[device].get()
                                                                     : nullptr;
  }
  void CountSessionOpened();
  void CountSessionRefused();
  // A gRPC call that ended with `code` (not OK), by its name.
  void CountRpcError(int grpc_code);
  // A command answered with an error of `code`.
  void CountCommandError(absl::StatusCode code);
  void CountHealthCheckFailure();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<std::unique_ptr<DeviceMetrics>> devices_;
  prometheus::Counter* sessions_opened_ = nullptr;
  prometheus::Counter* sessions_refused_ = nullptr;
  prometheus::Counter* health_failures_ = nullptr;
  prometheus::Family<prometheus::Counter>* rpc_errors_ = nullptr;
  // Labelled by code; a code's child is added on its first use (Family::Add
  // returns the existing child for labels it has; codes are a fixed set of 17).
  prometheus::Family<prometheus::Counter>* command_errors_ = nullptr;
};

// The gRPC / absl status code's name ("RESOURCE_EXHAUSTED").
absl::string_view StatusCodeName(int code);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_METRICS_H_
