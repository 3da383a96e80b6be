#include "sessions/session_registry.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {

absl::StatusOr<uint64_t> SessionRegistry::Admit(std::function<void()> cancel, int64_t uid) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError("flagosd is shutting down and accepts no new sessions");
  }
  if (sessions_.size() >= static_cast<size_t>(max_sessions_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "flagosd already serves ", sessions_.size(),
        " sessions, its limit; end other sessions or start flagosd with a larger "
        "--max-sessions"));
  }
  if (absl::StatusOr<size_t> left = SessionsLeftForLocked(uid); !left.ok()) {
    return left.status();
  }
  // A closing session may still run a command (on its sync channel's thread
  // too): bounding them bounds the commands and threads that sessions of
  // clients that left still hold.
  if (closing_.size() >= max_closing()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "flagosd is still closing ", closing_.size(),
        " sessions whose clients left while their commands ran (at most max(--max-sessions, ",
        kMinMaxClosingSessions, ") close at once); retry when their commands have returned, or "
        "start flagosd with a larger --max-sessions"));
  }
  const uint64_t id = next_id_++;
  sessions_.emplace(id, Entry{std::move(cancel), uid, nullptr});
  return id;
}

absl::StatusOr<size_t> SessionRegistry::SessionsLeftFor(int64_t uid) const {
  absl::MutexLock lock(&mu_);
  return SessionsLeftForLocked(uid);
}

absl::StatusOr<size_t> SessionRegistry::SessionsLeftForLocked(int64_t uid) const {
  if (max_sessions_per_uid_ <= 0 || uid < 0) return std::numeric_limits<size_t>::max();
  int of_user = 0;
  for (const auto& [id, entry] : sessions_) of_user += entry.uid == uid ? 1 : 0;
  if (of_user >= max_sessions_per_uid_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " has ", of_user, " sessions open, the most --max-sessions-per-uid=",
        max_sessions_per_uid_, " allows one user; end another of its processes, or ask the "
        "node's administrator for a larger limit"));
  }
  return static_cast<size_t>(max_sessions_per_uid_ - of_user);
}

void SessionRegistry::Attach(uint64_t id, std::shared_ptr<Session> session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.session = std::move(session);
}

void SessionRegistry::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(id);
}

SessionRegistry::~SessionRegistry() { WaitClosed(); }

void SessionRegistry::Retire(uint64_t id, std::function<void()> close) {
  JoinFinished();
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  std::shared_ptr<Session> session;
  if (it != sessions_.end()) {
    session = std::move(it->second.session);
    sessions_.erase(it);
  }
  Closer& closer = closing_[id];
  closer.session = std::move(session);
  // Started under mu_: the thread's own entry exists before it looks for it.
  closer.thread = std::thread([this, id, close = std::move(close)] {
    close();
    absl::MutexLock lock(&mu_);
    auto done = closing_.find(id);
    finished_.push_back(std::move(done->second.thread));
    closing_.erase(done);
  });
}

void SessionRegistry::JoinFinished() {
  std::vector<std::thread> finished;
  {
    absl::MutexLock lock(&mu_);
    finished.swap(finished_);
  }
  for (std::thread& thread : finished) thread.join();
}

void SessionRegistry::WaitClosed() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::map<uint64_t, Closer>* closing) { return closing->empty(); }, &closing_));
  }
  JoinFinished();
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Closing() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& [id, closer] : closing_) {
    if (closer.session != nullptr) sessions.push_back(closer.session);
  }
  return sessions;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& [id, entry] : sessions_) {
    if (entry.session != nullptr) sessions.push_back(entry.session);
  }
  return sessions;
}

std::shared_ptr<Session> SessionRegistry::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.session;
}

uint64_t SessionRegistry::sessions_total() const {
  absl::MutexLock lock(&mu_);
  return next_id_ - 1;
}

void SessionRegistry::CancelAll() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [id, entry] : sessions_) entry.cancel();
}

}  // namespace flagos::daemon
