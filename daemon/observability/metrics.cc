#include "observability/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

// Op durations in the daemon: 10 us (a tiny op) to 30 s.
const prometheus::Histogram::BucketBoundaries& OpDurationBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10, 30};
  return *kBuckets;
}

}  // namespace

absl::string_view StatusCodeName(int code) {
  static constexpr absl::string_view kNames[] = {
      "OK",       "CANCELLED",         "UNKNOWN",          "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",  "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[code];
}

void DeviceMetrics::CountOp(OpRoute route, double seconds, bool ok) {
  ops_[route == OpRoute::kNative ? 0 : 1]->Increment();
  op_duration_->Observe(seconds);
  if (!ok) op_errors_->Increment();
}

void DeviceMetrics::CountPreparedOps(uint64_t ops, double seconds) {
  if (ops == 0) return;
  ops_[0]->Increment(static_cast<double>(ops));
  const prometheus::Histogram::BucketBoundaries& bounds = OpDurationBuckets();
  const double mean = seconds / static_cast<double>(ops);
  std::vector<double> increments(bounds.size() + 1, 0.0);
  // Observe's bucket: the first bound the value does not exceed.
  increments[std::lower_bound(bounds.begin(), bounds.end(), mean) - bounds.begin()] =
      static_cast<double>(ops);
  op_duration_->ObserveMultiple(increments, seconds);
}

void DeviceMetrics::CountCopy(CopyDirection direction, uint64_t bytes) {
  copy_bytes_[static_cast<int>(direction)]->Increment(static_cast<double>(bytes));
}

void DeviceMetrics::CountCpuFallbackBytes(uint64_t to_host, uint64_t to_device) {
  if (to_device > 0) fallback_bytes_[0]->Increment(static_cast<double>(to_device));
  if (to_host > 0) fallback_bytes_[1]->Increment(static_cast<double>(to_host));
}

void DeviceMetrics::CountNativeDeclined() { native_declined_->Increment(); }

void DeviceMetrics::CountRepeatedOp() { repeated_ops_->Increment(); }

void DeviceMetrics::CountAllocation(uint64_t bytes) {
  allocations_->Increment();
  allocated_bytes_->Increment(static_cast<double>(bytes));
}

void DeviceMetrics::CountOutOfMemory() { out_of_memory_->Increment(); }

Metrics::Metrics(int devices) : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  auto& ops = prometheus::BuildCounter()
                  .Name("flagosd_ops_total")
                  .Help("Operator calls executed, by device and route (native: the backend's "
                        "kernels; cpu_fallback: operands copied to the host for ATen's CPU "
                        "kernels).")
                  .Register(r);
  auto& op_errors = prometheus::BuildCounter()
                        .Name("flagosd_op_errors_total")
                        .Help("Operator calls that failed, by device.")
                        .Register(r);
  auto& op_duration = prometheus::BuildHistogram()
                          .Name("flagosd_op_duration_seconds")
                          .Help("Time an operator call takes in the daemon (on an asynchronous "
                                "device: to check and issue it), by device.")
                          .Register(r);
  auto& copy_bytes = prometheus::BuildCounter()
                         .Name("flagosd_copy_bytes_total")
                         .Help("Bytes copied by client copy commands, by device and direction.")
                         .Register(r);
  auto& fallback_bytes =
      prometheus::BuildCounter()
          .Name("flagosd_cpu_fallback_bytes_total")
          .Help("Bytes the cpu_fallback route copied between a device and the host (operands "
                "to the host, results back), by device and direction.")
          .Register(r);
  auto& native_declined =
      prometheus::BuildCounter()
          .Name("flagosd_native_declined_total")
          .Help("Operator calls routed native that the backend's kernels declined (the vendor "
                "library's NOT_IMPLEMENT, a dtype or argument it does not take) and that ran on "
                "cpu_fallback instead, by device.")
          .Register(r);
  auto& repeated_ops =
      prometheus::BuildCounter()
          .Name("flagosd_ops_repeated_total")
          .Help("Eager operator calls that ran as the session's prepared copy of the same call "
                "sent before (the same bytes: op, tensors at the same addresses, scalars; the "
                "session's memory unchanged since), with no parse, decoding or checks, by "
                "device; counted in flagosd_ops_total too.")
          .Register(r);
  auto& allocations = prometheus::BuildCounter()
                          .Name("flagosd_segment_allocations_total")
                          .Help("Segments allocated for sessions, by device.")
                          .Register(r);
  auto& allocated_bytes = prometheus::BuildCounter()
                              .Name("flagosd_segment_allocated_bytes_total")
                              .Help("Bytes of the segments allocated for sessions, by device.")
                              .Register(r);
  auto& out_of_memory = prometheus::BuildCounter()
                            .Name("flagosd_out_of_memory_total")
                            .Help("Allocations refused because the device was out of memory, "
                                  "by device.")
                            .Register(r);
  for (int d = 0; d < devices; ++d) {
    const std::string index = absl::StrCat(d);
    auto m = std::make_unique<DeviceMetrics>();
    m->ops_[0] = &ops.Add({{"device", index}, {"route", "native"}});
    m->ops_[1] = &ops.Add({{"device", index}, {"route", "cpu_fallback"}});
    m->op_errors_ = &op_errors.Add({{"device", index}});
    m->op_duration_ = &op_duration.Add({{"device", index}}, OpDurationBuckets());
    m->copy_bytes_[0] = &copy_bytes.Add({{"device", index}, {"direction", "host_to_device"}});
    m->copy_bytes_[1] = &copy_bytes.Add({{"device", index}, {"direction", "device_to_host"}});
    m->copy_bytes_[2] = &copy_bytes.Add({{"device", index}, {"direction", "device_to_device"}});
    m->fallback_bytes_[0] =
        &fallback_bytes.Add({{"device", index}, {"direction", "host_to_device"}});
    m->fallback_bytes_[1] =
        &fallback_bytes.Add({{"device", index}, {"direction", "device_to_host"}});
    m->native_declined_ = &native_declined.Add({{"device", index}});
    m->repeated_ops_ = &repeated_ops.Add({{"device", index}});
    m->allocations_ = &allocations.Add({{"device", index}});
    m->allocated_bytes_ = &allocated_bytes.Add({{"device", index}});
    m->out_of_memory_ = &out_of_memory.Add({{"device", index}});
    devices_.push_back(std::move(m));
  }
  sessions_opened_ = &prometheus::BuildCounter()
                          .Name("flagosd_sessions_opened_total")
                          .Help("Client sessions opened since start.")
                          .Register(r)
                          .Add({});
  sessions_refused_ = &prometheus::BuildCounter()
                           .Name("flagosd_sessions_refused_total")
                           .Help("Sessions refused at admission (--max-sessions reached, or "
                                 "the daemon stopping).")
                           .Register(r)
                           .Add({});
  health_failures_ = &prometheus::BuildCounter()
                          .Name("flagosd_health_check_failures_total")
                          .Help("Health checks (device queues and listeners) that failed; "
                                "under systemd each one withholds a watchdog notification.")
                          .Register(r)
                          .Add({});
  rpc_errors_ = &prometheus::BuildCounter()
                     .Name("flagosd_rpc_errors_total")
                     .Help("gRPC calls (Negotiate, GetStats, Session) that ended with an "
                           "error, by status code.")
                     .Register(r);
  command_errors_ = &prometheus::BuildCounter()
                         .Name("flagosd_command_errors_total")
                         .Help("Commands answered with an error, by status code.")
                         .Register(r);
  // The codes every deployment sees, present from the start so that rates
  // and alerts have a series before the first error.
  for (const char* code : {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "INTERNAL"}) {
    rpc_errors_->Add({{"code", code}});
    command_errors_->Add({{"code", code}});
  }
}

Metrics::~Metrics() = default;

void Metrics::CountSessionOpened() { sessions_opened_->Increment(); }
void Metrics::CountSessionRefused() { sessions_refused_->Increment(); }
void Metrics::CountHealthCheckFailure() { health_failures_->Increment(); }

void Metrics::CountRpcError(int grpc_code) {
  rpc_errors_->Add({{"code", std::string(StatusCodeName(grpc_code))}}).Increment();
}

void Metrics::CountCommandError(absl::StatusCode code) {
  command_errors_->Add({{"code", std::string(StatusCodeName(static_cast<int>(code)))}})
      .Increment();
}

}  // namespace flagos::daemon
