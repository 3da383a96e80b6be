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
// kMaxRepeatedOpCalls of them per session. When it is full, a sweep drops
// the calls not found since the sweep before (an entry notes the sweep
// period of its last use), at most once per kMaxRepeatedOpCalls lookups, so
// that every call kept had that many lookups' time to come again; while
// nothing can go, new calls are neither kept nor prepared (MakeRoom). A
// loop with more calls than that keeps those it has (starting over would
// prepare each call every step and drop it before its next use: half an
// eager call again for nothing); a loop that changes sheds the old loop's
// calls within two sweeps.
//
// Thread safety: Find, MakeRoom, Put, Clear and size may be called
// concurrently (the reading thread finds and makes room, queue workers
// put); SeenBefore by one thread at a time (the reading thread).
#ifndef FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_
#define FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class PreparedOpCall;  // ops/prepared_op_call.h

inline constexpr size_t kMaxRepeatedOpCalls = 8192;
inline constexpr size_t kMaxRepeatedOpCallBytes = 1024;
// SeenBefore's memory: the hashes of up to this many calls not kept.
inline constexpr size_t kSeenOpCalls = 16384;

class RepeatedOpCalls {
 public:
  struct Entry {
    std::shared_ptr<const PreparedOpCall> call;
    // Session::MemoryRemovals when the call's ranges were checked.
    uint64_t removals = 0;
    // The sweep period in which it was last kept or found.
    mutable std::atomic<uint64_t> period{0};
  };

  // Devices 0 .. devices - 1.
  explicit RepeatedOpCalls(int devices)
      : devices_(devices > 0 ? devices : 0), by_device_(devices_) {}

  // The entry of the call whose OpCall bytes are `op` on `device`; null
  // when there is none (or `device` is out of range).
  std::shared_ptr<const Entry> Find(int device, absl::string_view op) const {
    if (device < 0 || static_cast<size_t>(device) >= devices_) return nullptr;
    absl::ReaderMutexLock lock(&mu_);
    // Counted without a read-modify-write (the reading thread is the one
    // finder): a count lost to a concurrent Find only delays a sweep.
    lookups_.store(lookups_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const auto& calls = by_device_[device];
    auto it = calls.find(op);
    if (it == calls.end()) return nullptr;
    if (it->second->period.load(std::memory_order_relaxed) != period_) {
      it->second->period.store(period_, std::memory_order_relaxed);
    }
    return it->second;
  }

  // True when the call whose OpCall bytes are `op` on `device` came
  // before, and remembers it; false for bytes it may not keep. It
  // remembers kSeenOpCalls calls, then starts over: a call a loop sends
  // each step is seen at its second step unless the loop sends more calls
  // it had not sent before (calls found are not looked up here) than that
  // in one step. (A direct-mapped table, which this was, never saw two
  // calls of a loop whose hashes share a slot: each overwrote the other
  // every step.)
  bool SeenBefore(int device, absl::string_view op) {
    if (op.size() > kMaxRepeatedOpCallBytes) return false;
    const uint64_t hash = absl::HashOf(device, op);
    if (seen_.contains(hash)) return true;
    if (seen_.size() >= kSeenOpCalls) seen_.clear();
    seen_.insert(hash);
    return false;
  }

  // True when a new call could be kept now: there is room, or a sweep that
  // is due made some. False tells the caller not to prepare a call only to
  // have Put turn it away.
  bool MakeRoom();

  // Keeps (or replaces) the entry of `op` on `device`; a new call is not
  // kept while the table is full and no sweep can make room.
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
  // When full and a sweep is due: moves the entries not found since the
  // last sweep into `dropped` (destroyed once mu_ is released) and starts a
  // new period. True when there is room afterwards.
  bool SweepIfFullLocked(std::vector<std::shared_ptr<const Entry>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t devices_;  // by_device_'s size, read without mu_
  mutable absl::Mutex mu_;
  std::vector<Calls> by_device_ ABSL_GUARDED_BY(mu_);
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  // Sweep periods: written under mu_ held exclusively, read under mu_.
  uint64_t period_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<uint64_t> lookups_{0};
  uint64_t lookups_at_sweep_ ABSL_GUARDED_BY(mu_) = 0;
  // SeenBefore's hashes (its one thread's).
  absl::flat_hash_set<uint64_t> seen_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_SESSIONS_REPEATED_OP_CALLS_H_
