// (ATen TU: a rank holds its gloo group)
#include "collectives/groups_between_daemons.h"

#include <c10/util/Exception.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/rank_between_daemons.h"

namespace flagos::daemon {

GroupsBetweenDaemons& GroupsBetweenDaemons::Get() {
  static auto* groups = new GroupsBetweenDaemons();
  return *groups;
}

absl::Status GroupsBetweenDaemons::Join(uint64_t session, int64_t pid, const std::string& comm,
                                        int rank, int nranks, const std::string& host, int port,
                                        absl::Duration timeout) {
  Key key{session, comm};
  {
    absl::MutexLock lock(&mu_);
    if (ranks_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "flagos process group: this session already is a rank of communicator ", comm));
    }
  }
  std::shared_ptr<RankBetweenDaemons> joined;
  try {
    joined = RankBetweenDaemons::Join(comm, rank, nranks, pid, host, port, timeout);
  } catch (const c10::Error& e) {
    return absl::UnavailableError(e.what_without_backtrace());
  }
  absl::MutexLock lock(&mu_);
  if (!ranks_.try_emplace(std::move(key), std::move(joined)).second) {
    return absl::AlreadyExistsError(absl::StrCat(
        "flagos process group: this session joined communicator ", comm, " twice at once"));
  }
  return absl::OkStatus();
}

std::shared_ptr<RankBetweenDaemons> GroupsBetweenDaemons::Find(uint64_t session,
                                                               const std::string& comm) const {
  absl::MutexLock lock(&mu_);
  if (ranks_.empty()) return nullptr;
  const auto it = ranks_.find(Key{session, comm});
  return it == ranks_.end() ? nullptr : it->second;
}

void GroupsBetweenDaemons::Leave(uint64_t session, const std::string& comm) {
  std::shared_ptr<RankBetweenDaemons> gone;  // ends after the lock
  absl::MutexLock lock(&mu_);
  if (auto it = ranks_.find(Key{session, comm}); it != ranks_.end()) {
    gone = std::move(it->second);
    ranks_.erase(it);
  }
}

void GroupsBetweenDaemons::NoteSessionLeft(uint64_t session) {
  std::vector<std::shared_ptr<RankBetweenDaemons>> ranks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      if (key.first == session) ranks.push_back(rank);
    }
  }
  for (const auto& rank : ranks) rank->NoteLeft();
}

void GroupsBetweenDaemons::LeaveSession(uint64_t session) {
  std::vector<std::shared_ptr<RankBetweenDaemons>> gone;  // end after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (it->first.first == session) {
      gone.push_back(std::move(it->second));
      ranks_.erase(it++);
    } else {
      ++it;
    }
  }
}

void GroupsBetweenDaemons::Count(uint64_t bytes, bool ok) {
  absl::MutexLock lock(&mu_);
  if (ok) {
    ++collectives_;
    bytes_ += bytes;
  } else {
    ++failed_;
  }
}

BetweenDaemonsCounts GroupsBetweenDaemons::counts() const {
  absl::MutexLock lock(&mu_);
  return {collectives_, bytes_, failed_, static_cast<uint64_t>(ranks_.size())};
}

}  // namespace flagos::daemon
