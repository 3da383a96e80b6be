#include "admission/pending_opens.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {

PendingOpens::Ticket::~Ticket() {
  if (owner_ != nullptr) owner_->Leave(id_);
}

bool PendingOpens::Ticket::expired() const { return owner_ != nullptr && owner_->Expired(id_); }

PendingOpens::PendingOpens(size_t limit, absl::Duration deadline, size_t per_connection)
    : limit_(limit),
      per_connection_(per_connection),
      per_uid_(std::max(per_connection, limit / 4)),
      deadline_(deadline),
      timer_([this] { TimerLoop(); }) {}

PendingOpens::~PendingOpens() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_.join();
}

absl::StatusOr<PendingOpens::Ticket> PendingOpens::Enter(absl::AnyInvocable<void()> cancel,
                                                        const Opener& opener,
                                                        size_t uid_allowance) {
  absl::MutexLock lock(&mu_);
  size_t waiting = 0, of_connection = 0, of_uid = 0;
  for (const auto& [id, entry] : entries_) {
    if (entry.expired) continue;
    ++waiting;
    if (!opener.connection.empty() && entry.opener.connection == opener.connection) {
      ++of_connection;
    }
    if (opener.uid >= 0 && entry.opener.uid == opener.uid) ++of_uid;
  }
  const std::string wait = absl::StrCat("each may wait ", absl::FormatDuration(deadline_),
                                        " for its `open`");
  if (waiting >= limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        limit_, " connections are waiting to open a session already (", wait, "); try again"));
  }
  if (!opener.connection.empty() && of_connection >= per_connection_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "connection ", opener.connection, " has ", of_connection,
        " session streams waiting to send `open` already, the most one connection may (", wait,
        "); send `open` on those first"));
  }
  if (opener.uid >= 0 && of_uid >= std::min(per_uid_, uid_allowance)) {
    if (of_uid >= uid_allowance) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", opener.uid, " has ", of_uid,
          " session streams waiting to send `open`, as many as the sessions "
          "--max-sessions-per-uid still lets it open; end another of its processes, or ask the "
          "node's administrator for a larger limit"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", opener.uid, " has ", of_uid, " session streams waiting to send `open` already, ",
        "the most one user may of the daemon's ", limit_, " (", wait, "); try again"));
  }
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{absl::Now() + deadline_, std::move(cancel), opener});
  return Ticket(this, id);
}

size_t PendingOpens::waiting_of_uid(int64_t uid) const {
  absl::MutexLock lock(&mu_);
  size_t of_uid = 0;
  for (const auto& [id, entry] : entries_) {
    of_uid += !entry.expired && entry.opener.uid == uid ? 1 : 0;
  }
  return of_uid;
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
