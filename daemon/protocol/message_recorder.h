// MessageRecorder: writes what one session's client sent as self-contained
// fuzzing inputs (`flagosd --record-client-messages=DIR`, off by default;
// tests/fuzz, scripts/fuzz). Nothing else in flagosd reads them.
//
// Each received ClientMessage becomes one file, `<dir>/s<session>-m<n>.pb`,
// holding one serialised ClientMessage. An `open` is written as received. A
// batch is rewritten so that it replays in a fresh session on its own:
//   1. one `allocate` per segment the batch names (device, size as the
//      session allocated it), in the order the batch first names them;
//   2. the `register_op` of every op the batch runs that an earlier batch
//      registered;
//   3. the batch's commands, with seq renumbered 1, 2, ... over the file
//      and every device address inside one of the session's segments
//      written as CanonicalSegmentAddress(j, offset), j counting the
//      allocates of step 1 from 0. Addresses outside every segment are
//      kept as they were.
// Replayers (tests/fuzz/session_fuzzer.cc) run the leading allocates first
// and map each canonical address to the segment their allocate returned.
//
// The session's segments are learned from its allocate commands and their
// replies (ObserveReply); a free forgets its segment.
//
// Thread safety: RecordIncoming is called by the session's reading thread,
// ObserveReply by whichever thread writes the reply; both may overlap.
#ifndef FLAGOS_DAEMON_PROTOCOL_MESSAGE_RECORDER_H_
#define FLAGOS_DAEMON_PROTOCOL_MESSAGE_RECORDER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// A canonical address names byte `offset` of segment `j` of a recorded file.
inline constexpr int kCanonicalSegmentShift = 40;
inline constexpr uint64_t kCanonicalOffsetMask = (uint64_t{1} << kCanonicalSegmentShift) - 1;
inline constexpr uint64_t CanonicalSegmentAddress(uint64_t j, uint64_t offset) {
  return ((j + 1) << kCanonicalSegmentShift) | (offset & kCanonicalOffsetMask);
}

class MessageRecorder {
 public:
  // Writes into `dir` (which must exist) the messages of session `session_id`.
  MessageRecorder(std::string dir, uint64_t session_id);

  MessageRecorder(const MessageRecorder&) = delete;
  MessageRecorder& operator=(const MessageRecorder&) = delete;

  // Writes `message` as described above. A file that cannot be written is
  // logged once per session and skipped; the session goes on.
  void RecordIncoming(const v1::ClientMessage& message);
  // Learns the segments allocate replies returned.
  void ObserveReply(const v1::ServerMessage& reply);

 private:
  struct Segment {
    int device = 0;
    uint64_t addr = 0;
    uint64_t nbytes = 0;
  };
  v1::ClientMessage Rewrite(const v1::CommandBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live segment holding `addr` on `device`; nullptr when none does.
  const Segment* Find(int device, uint64_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Write(const v1::ClientMessage& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::string dir_;
  const uint64_t session_id_;

  absl::Mutex mu_;
  uint64_t files_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  // Allocate commands sent and not yet replied: seq -> (device, nbytes).
  absl::flat_hash_map<uint64_t, std::pair<int, uint64_t>> pending_allocations_
      ABSL_GUARDED_BY(mu_);
  // Live segments by (device, first address).
  std::map<std::pair<int, uint64_t>, Segment> segments_ ABSL_GUARDED_BY(mu_);
  // Every register_op seen, by op id.
  absl::flat_hash_map<uint32_t, v1::RegisterOp> ops_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_PROTOCOL_MESSAGE_RECORDER_H_
