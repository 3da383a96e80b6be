// CompletionWaiters: the synchronous calls waiting for a Completion, by the
// seq of the command they sent. The reader thread hands each Completion to
// its waiter; a Completion nobody waits for is the caller's to interpret (an
// asynchronous error, or nothing).
//
// Not thread-safe; the owner serialises access (one mutex guards both the
// table and the slots it points to).
#ifndef FLAGOS_CLIENT_SRC_COMPLETION_WAITERS_H_
#define FLAGOS_CLIENT_SRC_COMPLETION_WAITERS_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

class CompletionWaiters {
 public:
  // Where a waiter's Completion lands; owned by the waiter.
  struct Slot {
    bool done = false;
    v1::Completion completion;
  };

  // REQUIRES: no waiter is registered for `seq`; `slot` outlives its
  // registration (until Deliver fills it or Unregister removes it).
  void Register(uint64_t seq, Slot* slot);

  // Removes the waiter for `seq`, if any (a waiter that gives up).
  void Unregister(uint64_t seq);

  // Moves `*completion` into the slot registered for its seq, marks the slot
  // done and unregisters it. Returns false (leaving `*completion` untouched)
  // when nobody waits for that seq.
  bool Deliver(v1::Completion* completion);

  bool empty() const { return slots_.empty(); }

 private:
  absl::flat_hash_map<uint64_t, Slot*> slots_;
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_COMPLETION_WAITERS_H_
