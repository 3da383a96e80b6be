// Whether flagosd can still serve: each device completes a tiny piece of
// work issued from the worker pool its sessions' queues run on
// (DeviceProbe), and the gRPC listener answers a Negotiate, each within a
// deadline. The systemd watchdog (watchdog.h) sends WATCHDOG=1 only after a
// passing check, so a daemon whose device pool is wedged, whose device
// stopped completing work, or whose listener is stuck stops being kept
// alive and systemd restarts it.
//
// A device probe that does not finish in time is not started again until
// it does: the device stays unhealthy, with how long it has been stuck in
// the error.
//
// Thread safety: Check is called by one thread at a time (the watchdog);
// StartDeviceProbes may be called from any thread.
#ifndef FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_
#define FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "execution/worker_pool.h"
#include "flagos/runtime.h"
#include "grpcpp/channel.h"
#include "observability/device_probe.h"

namespace flagos::daemon {

class HealthCheck {
 public:
  // Makes a new channel to the listener the check calls Negotiate on.
  using Connect = std::function<std::shared_ptr<grpc::Channel>()>;

  // One DeviceProbe per device d on `pools[d]` (the pool that runs device
  // d's stream queues; one per device of `runtime`). `endpoint` names the
  // listener `connect` reaches (one the server listens on).
  // REQUIRES: `runtime` outlives the check and the pools; the pools
  // outlive the check.
  HealthCheck(DeviceRuntime* runtime, const std::vector<WorkerPool*>& pools, std::string endpoint,
              Connect connect);

  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  // OK when every device's probe completed and the listener answered
  // within `timeout`. Else the first failure's code (DEADLINE_EXCEEDED for
  // a probe still waiting for a worker or the device, the probe's error,
  // UNAVAILABLE for the listener) with every failing device named, e.g.
  // "device flagos:1 has not completed the health probe's work ... issued
  // 4.2s ago: ...". The listener is asked only when the devices pass.
  absl::Status Check(absl::Duration timeout);

  // Starts a probe on every device that has none outstanding and returns
  // the attempts not yet complete (for the shutdown guard, at SIGTERM).
  std::vector<std::shared_ptr<const DeviceProbe::Attempt>> StartDeviceProbes();

 private:
  static std::vector<std::unique_ptr<DeviceProbe>> MakeProbes(
      DeviceRuntime* runtime, const std::vector<WorkerPool*>& pools);
  absl::Status CheckListener(absl::Duration timeout);

  const std::string endpoint_;
  const Connect connect_;
  const std::vector<std::unique_ptr<DeviceProbe>> probes_;  // by device
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OBSERVABILITY_HEALTH_CHECK_H_
