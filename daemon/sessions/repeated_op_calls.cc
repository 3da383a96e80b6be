#include "sessions/repeated_op_calls.h"

#include <utility>

namespace flagos::daemon {

bool RepeatedOpCalls::MakeRoom() {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (size_ < kMaxRepeatedOpCalls) return true;
  }
  std::vector<std::shared_ptr<const Entry>> dropped;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  return SweepIfFullLocked(&dropped);
}

void RepeatedOpCalls::Put(int device, absl::string_view op,
                          std::shared_ptr<const PreparedOpCall> call, uint64_t removals) {
  if (device < 0 || static_cast<size_t>(device) >= devices_ || call == nullptr ||
      op.size() > kMaxRepeatedOpCallBytes) {
    return;
  }
  auto entry = std::make_shared<Entry>();
  entry->call = std::move(call);
  entry->removals = removals;
  // The entries given up are destroyed after the lock is released.
  std::vector<std::shared_ptr<const Entry>> dropped;
  std::shared_ptr<const Entry> replaced;
  absl::MutexLock lock(&mu_);
  entry->period.store(period_, std::memory_order_relaxed);
  auto& calls = by_device_[device];
  auto it = calls.find(op);
  if (it != calls.end()) {
    replaced = std::exchange(it->second, std::move(entry));
    return;
  }
  if (!SweepIfFullLocked(&dropped)) return;
  calls.emplace(std::string(op), std::move(entry));
  ++size_;
}

void RepeatedOpCalls::Clear() {
  std::vector<Calls> dropped(devices_);
  absl::MutexLock lock(&mu_);
  for (size_t d = 0; d < devices_; ++d) dropped[d].swap(by_device_[d]);
  size_ = 0;
}

bool RepeatedOpCalls::SweepIfFullLocked(std::vector<std::shared_ptr<const Entry>>* dropped) {
  if (size_ < kMaxRepeatedOpCalls) return true;
  const uint64_t lookups = lookups_.load(std::memory_order_relaxed);
  if (lookups - lookups_at_sweep_ < kMaxRepeatedOpCalls) return false;
  for (Calls& calls : by_device_) {
    for (auto it = calls.begin(); it != calls.end();) {
      if (it->second->period.load(std::memory_order_relaxed) == period_) {
        ++it;
        continue;
      }
      dropped->push_back(std::move(it->second));
      calls.erase(it++);
      --size_;
    }
  }
  ++period_;
  lookups_at_sweep_ = lookups;
  return size_ < kMaxRepeatedOpCalls;
}

}  // namespace flagos::daemon
