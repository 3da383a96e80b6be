// How busy each device is: the time its stream queues spend executing
// commands. A device counts as busy while at least one of its queues (any
// session, any stream) is running commands, so two streams busy at once
// count once, as a utilisation figure should (busy time / wall time <= 1).
// On an asynchronous device this is the time spent issuing work; the
// device's own figure, where its management library has one, is in
// DeviceRuntime::GetTelemetry.
//
// A queue reports bursts, not commands: Begin when a worker picks up its
// work after it was idle or parked, End when it runs out or parks (a queue
// waiting for another stream's event or another device is not busy). DeviceActivity samples every
// clock once a second to give each device's utilisation over the last
// second.
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_EXECUTION_DEVICE_ACTIVITY_H_
#define FLAGOS_DAEMON_EXECUTION_DEVICE_ACTIVITY_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class BusyClock {
 public:
  // One queue started / stopped running commands on this device.
  void Begin();
  void End();
  // Busy time since the clock was created, including a burst under way.
  std::chrono::nanoseconds Busy() const;

 private:
  using Clock = std::chrono::steady_clock;
  // Last in the daemon's lock order: taken under a StreamQueue's lock
  // (Begin, End) and DeviceActivity's (Busy, sampling); nothing is locked
  // under it.
  mutable absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point since_ ABSL_GUARDED_BY(mu_);
  std::chrono::nanoseconds busy_ ABSL_GUARDED_BY(mu_){0};
};

class DeviceActivity {
 public:
  // Starts the sampling thread.
  explicit DeviceActivity(int devices);
  // Stops it.
  ~DeviceActivity();

  DeviceActivity(const DeviceActivity&) = delete;
  DeviceActivity& operator=(const DeviceActivity&) = delete;

  // The clock of `device`, or null for an index out of range.
  BusyClock* clock(int device) const;
  // Seconds `device` has been busy since start.
  double busy_seconds(int device) const;
  // Its busy share of the last whole second sampled (0..1).
  double utilization(int device) const;

 private:
  void SampleLoop();

  struct Device {
    BusyClock clock;
    std::chrono::nanoseconds sampled_busy{0};  // sampling thread only
    std::atomic<double> utilization{0.0};
  };
  std::vector<std::unique_ptr<Device>> devices_;

  // The sampler holds it (waiting for stopping_ with a timeout) while it
  // reads each device's BusyClock, whose lock comes after it.
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sampler_;  // last: started when everything above exists
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_EXECUTION_DEVICE_ACTIVITY_H_
