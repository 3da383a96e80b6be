#include "session_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {

absl::StatusOr<uint64_t> SessionRegistry::Admit(std::function<void()> cancel) {
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
  const uint64_t id = next_id_++;
  sessions_.emplace(id, Entry{std::move(cancel), nullptr});
  return id;
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
