#include "sessions/pending_releases.h"

#include <utility>

namespace flagos::daemon {

PendingReleases::PendingReleases(int devices) : pending_(devices + 1) {}

PendingReleases::Ticket PendingReleases::Schedule(int device) {
  absl::MutexLock lock(&mu_);
  const uint64_t number = next_++;
  Numbers(device).insert(number);
  ++count_;
  return Ticket{device, number};
}

void PendingReleases::Done(const Ticket& ticket) {
  std::vector<std::function<void()>> ready;
  {
    absl::MutexLock lock(&mu_);
    if (Numbers(ticket.device).erase(ticket.number) == 0) return;
    --count_;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (Clear(it->device, it->upto)) {
        ready.push_back(std::move(it->action));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::function<void()>& action : ready) action();
}

uint64_t PendingReleases::Latest() const {
  absl::MutexLock lock(&mu_);
  return next_ - 1;
}

void PendingReleases::WhenDone(int device, uint64_t upto, std::function<void()> action) {
  {
    absl::MutexLock lock(&mu_);
    if (!Clear(device, upto)) {
      waiters_.push_back(Waiter{device, upto, std::move(action)});
      return;
    }
  }
  action();
}

int PendingReleases::pending() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void PendingReleases::AwaitNonePending() const {
  absl::MutexLock lock(&mu_);
  const auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ == 0; };
  mu_.Await(absl::Condition(&none));
}

bool PendingReleases::Clear(int device, uint64_t upto) const {
  const auto clear = [upto](const std::set<uint64_t>& numbers) {
    return numbers.empty() || *numbers.begin() > upto;
  };
  if (!clear(pending_[0])) return false;
  if (device >= 0) return clear(pending_[device + 1]);
  for (size_t i = 1; i < pending_.size(); ++i) {
    if (!clear(pending_[i])) return false;
  }
  return true;
}

}  // namespace flagos::daemon
