#include "sessions/repeated_op_calls.h"

#include <utility>

namespace flagos::daemon {

void RepeatedOpCalls::Put(int device, absl::string_view op,
                          std::shared_ptr<const PreparedOpCall> call, uint64_t removals) {
  if (device < 0 || static_cast<size_t>(device) >= by_device_.size() || call == nullptr ||
      op.size() > kMaxRepeatedOpCallBytes) {
    return;
  }
  auto entry = std::make_shared<Entry>();
  entry->call = std::move(call);
  entry->removals = removals;
  // The entries given up are destroyed after the lock is released.
  std::vector<Calls> dropped;
  std::shared_ptr<const Entry> replaced;
  absl::MutexLock lock(&mu_);
  auto& calls = by_device_[device];
  auto it = calls.find(op);
  if (it != calls.end()) {
    replaced = std::exchange(it->second, std::move(entry));
    return;
  }
  if (size_ >= kMaxRepeatedOpCalls) TakeAllLocked(&dropped);
  by_device_[device].emplace(std::string(op), std::move(entry));
  ++size_;
}

void RepeatedOpCalls::Clear() {
  std::vector<Calls> dropped;
  absl::MutexLock lock(&mu_);
  TakeAllLocked(&dropped);
}

void RepeatedOpCalls::TakeAllLocked(std::vector<Calls>* dropped) {
  dropped->resize(by_device_.size());
  for (size_t d = 0; d < by_device_.size(); ++d) (*dropped)[d].swap(by_device_[d]);
  size_ = 0;
}

}  // namespace flagos::daemon
