#include "execution/device_activity.h"

#include <algorithm>

#include "absl/time/time.h"

namespace flagos::daemon {

void BusyClock::Begin() {
  absl::MutexLock lock(&mu_);
  if (active_++ == 0) since_ = Clock::now();
}

void BusyClock::End() {
  absl::MutexLock lock(&mu_);
  if (active_ == 0) return;  // unmatched: ignore rather than go negative
  if (--active_ == 0) busy_ += Clock::now() - since_;
}

std::chrono::nanoseconds BusyClock::Busy() const {
  absl::MutexLock lock(&mu_);
  return active_ == 0 ? busy_ : busy_ + (Clock::now() - since_);
}

DeviceActivity::DeviceActivity(int devices) {
  for (int d = 0; d < devices; ++d) devices_.push_back(std::make_unique<Device>());
  sampler_ = std::thread(&DeviceActivity::SampleLoop, this);
}

DeviceActivity::~DeviceActivity() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sampler_.join();
}

BusyClock* DeviceActivity::clock(int device) const {
  if (device < 0 || device >= static_cast<int>(devices_.size())) return nullptr;
  return &devices_[device]->clock;
}

double DeviceActivity::busy_seconds(int device) const {
  const BusyClock* c = clock(device);
  return c == nullptr ? 0.0 : std::chrono::duration<double>(c->Busy()).count();
}

double DeviceActivity::utilization(int device) const {
  if (device < 0 || device >= static_cast<int>(devices_.size())) return 0.0;
  return devices_[device]->utilization.load(std::memory_order_relaxed);
}

void DeviceActivity::SampleLoop() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1))) {
    const Clock::time_point now = Clock::now();
    const double wall = std::chrono::duration<double>(now - last).count();
    last = now;
    for (const std::unique_ptr<Device>& device : devices_) {
      const std::chrono::nanoseconds busy = device->clock.Busy();
      const double share =
          wall <= 0 ? 0.0 : std::chrono::duration<double>(busy - device->sampled_busy).count() / wall;
      device->sampled_busy = busy;
      device->utilization.store(std::clamp(share, 0.0, 1.0), std::memory_order_relaxed);
    }
  }
}

}  // namespace flagos::daemon
