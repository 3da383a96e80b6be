// Session streams that have not sent `open` yet. Each holds a server thread
// outside --max-sessions, so they are bounded in number and each is
// cancelled when it has not opened within a deadline (a client that connects
// and sends nothing, or drips bytes, cannot hold the daemon's threads).
#ifndef FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_
#define FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_

#include <cstddef>
#include <cstdint>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flagos::daemon {

// Defaults: streams waiting to open at once, and how long each may wait.
inline constexpr size_t kMaxPendingOpens = 64;
inline constexpr int kOpenDeadlineSeconds = 10;
inline constexpr absl::Duration kOpenDeadline = absl::Seconds(kOpenDeadlineSeconds);

class PendingOpens {
 public:
  // A stream's wait; destroying it ends the wait (before or after expiry).
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept : owner_(other.owner_), id_(other.id_) {
      other.owner_ = nullptr;
    }
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();
    // True when the deadline passed and the stream was cancelled.
    bool expired() const;

   private:
    friend class PendingOpens;
    Ticket(PendingOpens* owner, uint64_t id) : owner_(owner), id_(id) {}
    PendingOpens* owner_;
    uint64_t id_;
  };

  PendingOpens(size_t limit, absl::Duration deadline);
  // Stops the timer; every ticket must be gone.
  ~PendingOpens();
  PendingOpens(const PendingOpens&) = delete;
  PendingOpens& operator=(const PendingOpens&) = delete;

  // A stream starts waiting for its `open`; `cancel` runs (once, under this
  // object's lock, so never after the ticket is destroyed) if the deadline
  // passes first. RESOURCE_EXHAUSTED when `limit` streams wait already.
  absl::StatusOr<Ticket> Enter(absl::AnyInvocable<void()> cancel);

  size_t waiting() const;

 private:
  struct Entry {
    absl::Time deadline;
    absl::AnyInvocable<void()> cancel;
    bool expired = false;
  };
  void Leave(uint64_t id);
  bool Expired(uint64_t id) const;
  void TimerLoop();

  const size_t limit_;
  const absl::Duration deadline_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_
