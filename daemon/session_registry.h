// The live sessions of a flagosd: admission (--max-sessions), lookup for
// statistics, and cancellation at shutdown.
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_SESSION_REGISTRY_H_
#define FLAGOS_DAEMON_SESSION_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "session.h"

namespace flagos::daemon {

class SessionRegistry {
 public:
  explicit SessionRegistry(int max_sessions) : max_sessions_(max_sessions) {}

  SessionRegistry(const SessionRegistry&) = delete;
  SessionRegistry& operator=(const SessionRegistry&) = delete;

  // Admits a new session and returns its id. RESOURCE_EXHAUSTED when
  // max_sessions sessions are live; UNAVAILABLE after CancelAll.
  // `cancel` ends the session's stream (called by CancelAll); it must stay
  // callable until Remove(id) returns.
  absl::StatusOr<uint64_t> Admit(std::function<void()> cancel);
  // Makes an admitted session visible to Snapshot.
  void Attach(uint64_t id, std::shared_ptr<Session> session);
  // Drops the session; after this `cancel` is never called.
  void Remove(uint64_t id);

  // The live session `id`, or null.
  std::shared_ptr<Session> Find(uint64_t id) const;
  // The live sessions, by id.
  std::vector<std::shared_ptr<Session>> Snapshot() const;
  // Sessions admitted since start.
  uint64_t sessions_total() const;

  // Refuses new sessions and cancels every live one.
  void CancelAll();

 private:
  struct Entry {
    std::function<void()> cancel;
    std::shared_ptr<Session> session;  // null until Attach
  };

  const int max_sessions_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSION_REGISTRY_H_
