// Device-memory quotas: --session-memory-limit (what one session may hold
// on each device) and --uid-memory-limit (what all sessions of one user may
// hold on each device together). A session reserves the bytes of each
// allocation before the backend allocates, and releases them when the
// segment leaves it (free, or the session's end).
//
// The user is the session's peer uid from the kernel; sessions without one
// (TCP) count together as one unknown user. Memory another session imported
// counts for its owner only, until the owner frees it.
//
// Thread safety: all methods may be called from any thread.
#ifndef FLAGOS_DAEMON_MEMORY_MEMORY_QUOTAS_H_
#define FLAGOS_DAEMON_MEMORY_MEMORY_QUOTAS_H_

#include <cstdint>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

struct MemoryLimits {
  uint64_t session_bytes = 0;  // per session and device; 0: no limit
  uint64_t uid_bytes = 0;      // per user and device; 0: no limit
};

class MemoryQuotas {
 public:
  explicit MemoryQuotas(MemoryLimits limits) : limits_(limits) {}

  MemoryQuotas(const MemoryQuotas&) = delete;
  MemoryQuotas& operator=(const MemoryQuotas&) = delete;

  const MemoryLimits& limits() const { return limits_; }

  // Takes `nbytes` on `device` for session `session` of user `uid` (-1:
  // unknown). RESOURCE_EXHAUSTED, naming the limit, the flag and who holds
  // the memory, when that would take the session or its user beyond a limit.
  absl::Status Reserve(uint64_t session, int64_t uid, int device, uint64_t nbytes);
  // Gives back what Reserve took.
  void Release(uint64_t session, int64_t uid, int device, uint64_t nbytes);

  // What session `session` holds on `device`, and what user `uid` does.
  uint64_t session_bytes(uint64_t session, int device) const;
  uint64_t uid_bytes(int64_t uid, int device) const;

 private:
  const MemoryLimits limits_;
  // A leaf, taken under a session's dispatch_mu_ (allocate) or memory_mu_
  // (free, close): session.h's lock order.
  mutable absl::Mutex mu_;
  // (uid, device) -> session -> bytes held.
  std::map<std::pair<int64_t, int>, std::map<uint64_t, uint64_t>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_MEMORY_QUOTAS_H_
