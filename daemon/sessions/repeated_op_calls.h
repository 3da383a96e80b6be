// The op calls a session sent before, prepared (ops/prepared_op_call.h), by
// the bytes of their OpCall: an eager op sent again byte for byte (the same
// op id, the same tensors at the same addresses, the same scalars, as a
// training loop sends each step once its allocator settles) runs as its
// prepared call, with no protobuf parse, no decoding, no argument rules and
// no per-op range checks: sessions/session_repeated_ops.cc.
//
// Those checks are a function of the bytes and of the session's memory
// (the op id's registration never changes): each entry records how many
// segments the session had given up when its ranges were checked
// (Session::MemoryRemovals), and runs prepared only while that is
// unchanged; else the call runs as sent, checked, and its entry is
// replaced. Only calls OpRunner::Run prepares are kept: the native route,
// no values sent back, no generator, nothing after the kernel call.
//
// A call is prepared the second time its bytes come (SeenBefore), not the
// first: preparing costs about half an eager call again, which a call
// sent once (one whose output lands at a new address each time) would pay
// for nothing.
//
// Bounded: calls of up to kMaxRepeatedOpCallBytes bytes, at most
// kMaxRepeatedOpCalls of them per session; when it is full it starts over
// (a step's calls fill it again at the next step).
//
// Thread safety: Find, Put, Clear and size may be called concurrently (the
// reading thread finds, queue workers put); SeenBefore by one thread at a
// time (the reading thread).
#ifndef FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_
#define FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class PreparedOpCall;  // ops/prepared_op_call.h

inline constexpr size_t kMaxRepeatedOpCalls = 8192;
inline constexpr size_t kMaxRepeatedOpCallBytes = 1024;
// SeenBefore's memory: a direct-mapped table of this many hashes.
inline constexpr size_t kSeenOpCallSlots = 4096;

class RepeatedOpCalls {
 public:
  struct Entry {
    std::shared_ptr<const PreparedOpCall> call;
    // Session::MemoryRemovals when the call's ranges were checked.
    uint64_t removals = 0;
  };

  // Devices 0 .. devices - 1.
  explicit RepeatedOpCalls(int devices) : by_device_(devices > 0 ? devices : 0) {}

  // The entry of the call whose OpCall bytes are `op` on `device`; null
  // when there is none (or `device` is out of range).
  std::shared_ptr<const Entry> Find(int device, absl::string_view op) const {
    if (device < 0 || static_cast<size_t>(device) >= by_device_.size()) return nullptr;
    absl::ReaderMutexLock lock(&mu_);
    const auto& calls = by_device_[device];
    auto it = calls.find(op);
    return it == calls.end() ? nullptr : it->second;
  }

  // True when the call whose OpCall bytes are `op` on `device` came
  // before (as far as the table remembers: a slot holds the last call
  // hashed there), and remembers it; false for bytes it may not keep.
  bool SeenBefore(int device, absl::string_view op) {
    if (op.size() > kMaxRepeatedOpCallBytes) return false;
    const uint64_t hash = absl::HashOf(device, op);
    uint64_t& slot = seen_[hash % kSeenOpCallSlots];
    const bool seen = slot == hash;
    slot = hash;
    return seen;
  }

  // Keeps (or replaces) the entry of `op` on `device`.
  void Put(int device, absl::string_view op, std::shared_ptr<const PreparedOpCall> call,
           uint64_t removals);

  // Forgets every entry.
  void Clear();

  size_t size() const {
    absl::ReaderMutexLock lock(&mu_);
    return size_;
  }

 private:
  using Calls = absl::flat_hash_map<std::string, std::shared_ptr<const Entry>>;
  // Moves every entry into `dropped` (to be destroyed once mu_ is released).
  void TakeAllLocked(std::vector<Calls>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<Calls> by_device_ ABSL_GUARDED_BY(mu_);
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  // SeenBefore's table (its one thread's).
  std::vector<uint64_t> seen_ = std::vector<uint64_t>(kSeenOpCallSlots, 0);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_
