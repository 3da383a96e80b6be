#include "memory/pending_frees.h"

#include <utility>

namespace flagos::daemon {

PendingFrees::Ticket PendingFrees::Add(int device) {
  absl::MutexLock lock(&mu_);
  const uint64_t number = ++latest_;
  numbers_[device].insert(number);
  ++pending_;
  return Ticket{device, number};
}

void PendingFrees::Done(const Ticket& ticket) {
  std::vector<std::function<void()>> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = numbers_.find(ticket.device);
    if (it == numbers_.end() || it->second.erase(ticket.number) == 0) return;
    if (it->second.empty()) numbers_.erase(it);
    --pending_;
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      if (Clear(w->device, w->upto)) {
        ready.push_back(std::move(w->action));
        w = waiters_.erase(w);
      } else {
        ++w;
      }
    }
  }
  for (std::function<void()>& action : ready) action();
}

bool PendingFrees::WaitForNone() {
  absl::MutexLock lock(&mu_);
  if (pending_ == 0) return false;
  mu_.Await(absl::Condition(+[](int* pending) { return *pending == 0; }, &pending_));
  return true;
}

uint64_t PendingFrees::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

void PendingFrees::WhenDone(int device, uint64_t upto, std::function<void()> action) {
  {
    absl::MutexLock lock(&mu_);
    if (!Clear(device, upto)) {
      waiters_.push_back(Waiter{device, upto, std::move(action)});
      return;
    }
  }
  action();
}

int PendingFrees::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

bool PendingFrees::Clear(int device, uint64_t upto) const {
  for (const auto& [on, numbers] : numbers_) {
    if (device >= 0 && on >= 0 && on != device) continue;
    if (*numbers.begin() <= upto) return false;
  }
  return true;
}

}  // namespace flagos::daemon
