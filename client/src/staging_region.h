// StagingRegion (client side): the session's shared staging region, a
// sealed memfd this process creates, maps and hands to flagosd over the
// staging socket (flagos.proto, StagingAttach: layout and flag protocol).
//
// The data area is a ring of fixed-size slots. A chunk is a run of whole
// slots claimed in ring order; it is free again once the flag of its first
// slot is 0 — cleared by the daemon after a staged upload executed, or by
// this process (Release) after it read a staged download. Space is
// reclaimed in claim order, so a chunk still in use holds back the ring
// behind it.
//
// Thread safety: all methods may be called from any thread.
#ifndef FLAGOS_CLIENT_SRC_STAGING_REGION_H_
#define FLAGOS_CLIENT_SRC_STAGING_REGION_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flagos::client {

class StagingRegion {
 public:
  struct Chunk {
    uint64_t offset = 0;  // from the start of the data area
    uint64_t nbytes = 0;
    char* data = nullptr;
  };

  // A region with a data area of `data_bytes` (a multiple of `slot_bytes`,
  // itself a multiple of 4096).
  static absl::StatusOr<std::unique_ptr<StagingRegion>> Create(uint64_t data_bytes,
                                                               uint64_t slot_bytes);
  ~StagingRegion();

  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;

  // Sends the region to the daemon for session `session_id` over the Unix
  // socket `socket_path` and waits (until `deadline`) for its answer.
  // Returns the connected socket, which stays open as the session's sync
  // channel (the caller owns it).
  absl::StatusOr<int> Attach(const std::string& socket_path, uint64_t session_id,
                             const std::string& token, absl::Time deadline);

  // Claims a chunk of `nbytes` (0 < nbytes ≤ max_chunk()); nullopt when the
  // ring has no room now (retry once earlier chunks are freed).
  std::optional<Chunk> TryClaim(uint64_t nbytes);
  // Frees a chunk this process consumed (a staged download).
  void Release(uint64_t offset);

  // The largest chunk claimed at once: a quarter of the ring, so that
  // large copies pipeline.
  uint64_t max_chunk() const { return max_chunk_; }

 private:
  struct Claimed {
    uint64_t first_slot;
    uint64_t slots;
  };

  StagingRegion(int fd, char* base, uint64_t size, uint64_t slot_bytes, uint64_t slot_count,
                uint64_t data_offset);
  // Pops chunks that are free again off the front of the ring.
  void ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t LoadFlag(uint64_t slot) const;
  void StoreFlag(uint64_t slot, uint8_t value);

  const int fd_;
  char* const base_;
  const uint64_t size_;
  const uint64_t slot_bytes_;
  const uint64_t slot_count_;
  const uint64_t data_offset_;
  const uint64_t max_chunk_;

  absl::Mutex mu_;
  std::deque<Claimed> claimed_ ABSL_GUARDED_BY(mu_);  // in ring order
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;             // next slot to claim
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_STAGING_REGION_H_
