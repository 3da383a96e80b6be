// The segments (device allocations) one session holds: an interval map per
// device. Every address a session's command names is checked here before
// the daemon touches it, so a session can never name memory it was not
// given.
//
// Thread safety: all methods may be called concurrently (the session's
// reading thread inserts while its stream workers look ranges up).
#ifndef FLAGOS_DAEMON_MEMORY_SEGMENT_TABLE_H_
#define FLAGOS_DAEMON_MEMORY_SEGMENT_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

struct Segment {
  int device = 0;
  DevicePtr addr = 0;
  uint64_t nbytes = 0;
};

class SegmentTable {
 public:
  SegmentTable() = default;
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;

  // Adds [addr, addr + nbytes) on `device`. INVALID_ARGUMENT when nbytes is
  // 0 or the range wraps around; ALREADY_EXISTS when it overlaps a segment
  // already in the table.
  absl::Status Insert(int device, DevicePtr addr, uint64_t nbytes);

  // Removes the segment that starts at `addr`. NOT_FOUND when no segment
  // starts there (an address inside a segment is not enough).
  absl::StatusOr<Segment> Remove(int device, DevicePtr addr);

  // The segment containing byte `addr`, if any.
  std::optional<Segment> Lookup(int device, DevicePtr addr) const;

  // True when [addr, addr + nbytes) lies wholly inside one segment of
  // `device`. A range spanning two adjacent segments is not contained. An
  // empty range is contained when `addr` lies in a segment or at its end.
  bool Contains(int device, DevicePtr addr, uint64_t nbytes) const;

  // Removes and returns every segment (for the end of the session).
  std::vector<Segment> TakeAll();

  // How many segments were removed (Remove, TakeAll) so far: while it has
  // not changed, a range found contained before still is (a captured
  // graph's replays check their ranges again only when it changed).
  uint64_t removals() const { return removals_.load(std::memory_order_acquire); }

  uint64_t total_bytes() const;
  uint64_t device_bytes(int device) const;
  uint64_t size() const;

 private:
  using Intervals = std::map<DevicePtr, uint64_t>;  // start -> nbytes

  // The segment whose start is the greatest <= addr.
  static std::optional<Segment> Floor(int device, const Intervals& intervals, DevicePtr addr);

  // A leaf, taken under a session's memory_mu_ (session.h's lock order).
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Intervals> devices_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, uint64_t> device_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> removals_{0};
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_SEGMENT_TABLE_H_
