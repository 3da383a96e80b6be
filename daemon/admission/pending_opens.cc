#include "admission/pending_opens.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {

PendingOpens::Ticket::~Ticket() {
  if (owner_ != nullptr) owner_->Leave(id_);
}

bool PendingOpens::Ticket::expired() const { return owner_ != nullptr && owner_->Expired(id_); }

PendingOpens::PendingOpens(size_t limit, absl::Duration deadline)
    : limit_(limit), deadline_(deadline), timer_([this] { TimerLoop(); }) {}

PendingOpens::~PendingOpens() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_.join();
}

absl::StatusOr<PendingOpens::Ticket> PendingOpens::Enter(absl::AnyInvocable<void()> cancel) {
  absl::MutexLock lock(&mu_);
  size_t waiting = 0;
  for (const auto& [id, entry] : entries_) waiting += entry.expired ? 0 : 1;
  if (waiting >= limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        limit_, " connections are waiting to open a session already (each may wait ",
        absl::FormatDuration(deadline_), " for its `open`); try again"));
  }
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{absl::Now() + deadline_, std::move(cancel)});
  return Ticket(this, id);
}

size_t PendingOpens::waiting() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

void PendingOpens::Leave(uint64_t id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(id);
}

bool PendingOpens::Expired(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.expired;
}

void PendingOpens::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (auto& [id, entry] : entries_) {
      if (entry.expired) continue;
      if (entry.deadline <= now) {
        entry.expired = true;
        entry.cancel();
      } else if (entry.deadline < next) {
        next = entry.deadline;
      }
    }
    // Every deadline is Enter's time plus the same duration, so a new entry
    // is never the earliest: wake at `next`, or for the first entry, or to stop.
    struct Seen {
      PendingOpens* self;
      uint64_t next_id;
    } seen{this, next_id_};
    mu_.AwaitWithDeadline(
        absl::Condition(
            +[](Seen* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return s->self->stopping_ || s->self->next_id_ != s->next_id;
            },
            &seen),
        next);
  }
}

}  // namespace flagos::daemon
