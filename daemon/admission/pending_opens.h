// Session streams that have not sent `open` yet. Each holds a server thread
// outside --max-sessions, so they are bounded in number and each is
// cancelled when it has not opened within a deadline (a client that connects
// and sends nothing, or drips bytes, cannot hold the daemon's threads).
// The bound is shared fairly: one connection may have a few streams waiting
// (a client opens one session per connection), one user a quarter of them,
// and a user's waiting streams count against the sessions it may still open
// (--max-sessions-per-uid), so that no connection or user can keep the
// others from opening sessions.
#ifndef FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_
#define FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flagos::daemon {

// Defaults: streams waiting to open at once, and how long each may wait.
inline constexpr size_t kMaxPendingOpens = 64;
// Of those, how many one connection may have waiting.
inline constexpr size_t kMaxPendingOpensPerConnection = 4;
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

  // Who waits: the connection the stream came on (the gRPC peer, "fd:N" for
  // a unix socket the daemon accepted, "ipv4:addr:port" over TCP; empty:
  // unknown, not limited per connection) and its user from the kernel (-1:
  // unknown, a TCP peer: not limited per user).
  struct Opener {
    std::string connection;
    int64_t uid = -1;
  };

  // At most `limit` streams wait at once, `per_connection` of one
  // connection and max(per_connection, limit / 4) of one user.
  PendingOpens(size_t limit, absl::Duration deadline,
               size_t per_connection = kMaxPendingOpensPerConnection);
  // Stops the timer; every ticket must be gone.
  ~PendingOpens();
  PendingOpens(const PendingOpens&) = delete;
  PendingOpens& operator=(const PendingOpens&) = delete;

  // A stream of `opener` starts waiting for its `open`; `cancel` runs
  // (once, under this object's lock, so never after the ticket is
  // destroyed) if the deadline passes first. RESOURCE_EXHAUSTED, naming the
  // bound, when `limit` streams wait already, or the connection's or the
  // user's share do, or the user has `uid_allowance` streams waiting (the
  // sessions it may still open: --max-sessions-per-uid less those it has).
  absl::StatusOr<Ticket> Enter(absl::AnyInvocable<void()> cancel, const Opener& opener,
                               size_t uid_allowance = std::numeric_limits<size_t>::max());
  // A stream of an unknown opener (no limit but `limit`).
  absl::StatusOr<Ticket> Enter(absl::AnyInvocable<void()> cancel) {
    return Enter(std::move(cancel), Opener());
  }

  size_t waiting() const;
  // Streams of user `uid` waiting now (expired ones not counted).
  size_t waiting_of_uid(int64_t uid) const;

 private:
  struct Entry {
    absl::Time deadline;
    absl::AnyInvocable<void()> cancel;
    Opener opener;
    bool expired = false;
  };
  void Leave(uint64_t id);
  bool Expired(uint64_t id) const;
  void TimerLoop();

  const size_t limit_;
  const size_t per_connection_;
  const size_t per_uid_;
  const absl::Duration deadline_;
  // A leaf among the daemon's locks (the timer waits on it holding nothing
  // else).
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_PENDING_OPENS_H_
