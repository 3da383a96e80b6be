// The live sessions of a flagosd: admission (--max-sessions), lookup for
// statistics, and cancellation at shutdown; and the closing sessions: those
// whose client left (cancelled its stream, died) while a command of theirs
// still ran. A closing session holds no slot and is not live (Find and
// Snapshot do not return it); it keeps what it holds, counted (Closing), until
// its close, on a thread of its own, returns.
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_SESSIONS_SESSION_REGISTRY_H_
#define FLAGOS_DAEMON_SESSIONS_SESSION_REGISTRY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sessions/session.h"

namespace flagos::daemon {

// Sessions that may be closing at once: max(max_sessions, this).
inline constexpr size_t kMinMaxClosingSessions = 16;

class SessionRegistry {
 public:
  // `max_sessions_per_uid` (0: no limit) bounds the live sessions of one
  // user (--max-sessions-per-uid).
  explicit SessionRegistry(int max_sessions, int max_sessions_per_uid = 0)
      : max_sessions_(max_sessions), max_sessions_per_uid_(max_sessions_per_uid) {}
  // WaitClosed().
  ~SessionRegistry();

  SessionRegistry(const SessionRegistry&) = delete;
  SessionRegistry& operator=(const SessionRegistry&) = delete;

  // Admits a new session of user `uid` (-1: unknown, never limited per
  // user) and returns its id. RESOURCE_EXHAUSTED when max_sessions sessions
  // are live, or max_sessions_per_uid of `uid`'s, or max_closing() are
  // closing; UNAVAILABLE after CancelAll.
  // `cancel` ends the session's stream (called by CancelAll); it must stay
  // callable until Remove(id) returns.
  absl::StatusOr<uint64_t> Admit(std::function<void()> cancel, int64_t uid = -1);
  // How many more sessions user `uid` may open (--max-sessions-per-uid less
  // its live sessions; SIZE_MAX when there is no limit or `uid` is -1).
  // RESOURCE_EXHAUSTED, as Admit gives it, when none.
  absl::StatusOr<size_t> SessionsLeftFor(int64_t uid) const;
  // Makes an admitted session visible to Snapshot.
  void Attach(uint64_t id, std::shared_ptr<Session> session);
  // Drops the session; after this `cancel` is never called.
  void Remove(uint64_t id);
  // Drops live session `id` as Remove does (its slot is free at once) and
  // keeps it among the closing sessions while `close` runs on a thread of
  // its own; it leaves them when `close` returns. Does not wait.
  void Retire(uint64_t id, std::function<void()> close);
  // Waits until every retired session's `close` returned.
  void WaitClosed();

  // The live session `id`, or null.
  std::shared_ptr<Session> Find(uint64_t id) const;
  // The live sessions, by id.
  std::vector<std::shared_ptr<Session>> Snapshot() const;
  // The closing sessions (Retire), by id.
  std::vector<std::shared_ptr<Session>> Closing() const;
  // Sessions admitted since start.
  uint64_t sessions_total() const;
  // Sessions that may be closing at once.
  size_t max_closing() const {
    return std::max(static_cast<size_t>(max_sessions_), kMinMaxClosingSessions);
  }

  // Refuses new sessions and cancels every live one.
  void CancelAll();

 private:
  absl::StatusOr<size_t> SessionsLeftForLocked(int64_t uid) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Entry {
    std::function<void()> cancel;
    int64_t uid = -1;
    std::shared_ptr<Session> session;  // null until Attach
  };

  struct Closer {
    std::shared_ptr<Session> session;  // null when it was never attached
    std::thread thread;                // runs `close`
  };
  // Joins the closers that finished (outside mu_).
  void JoinFinished();

  const int max_sessions_;
  const int max_sessions_per_uid_;
  // Before no session lock: sessions are closed (on their reading thread or
  // a closer thread) and asked for Info outside it. Under it only the
  // streams' cancel callbacks run (gRPC's own locks).
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Closer> closing_ ABSL_GUARDED_BY(mu_);
  // Threads of closers whose `close` returned, to be joined.
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_SESSION_REGISTRY_H_
