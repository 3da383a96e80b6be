// StagingRegion: the daemon's mapping of one session's shared staging region
// (a sealed memfd the client created and sent over the staging socket; see
// StagingAttach in flagos.proto for the layout).
//
// The client writes and reads the data area concurrently with the daemon;
// every range the daemon touches is checked against the data area, and the
// memfd must be sealed against shrinking, so no client action can make the
// daemon touch memory outside the mapping (or fault on a truncated file).
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_MEMORY_STAGING_REGION_H_
#define FLAGOS_DAEMON_MEMORY_STAGING_REGION_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// Bounds on what a client may ask the daemon to map.
inline constexpr uint64_t kMinStagingSlotBytes = 4096;
inline constexpr uint64_t kMaxStagingSlotBytes = 64ull << 20;
inline constexpr uint64_t kMaxStagingRegionBytes = 4ull << 30;

class StagingRegion {
 public:
  // Checks `layout` against the memfd `fd` and maps it. Always closes `fd`.
  // INVALID_ARGUMENT (what is wrong, what to send instead) when the layout
  // does not fit the file, the file is not a memfd sealed against
  // shrinking, or a bound above is exceeded.
  static absl::StatusOr<std::unique_ptr<StagingRegion>> Map(int fd,
                                                            const v1::StagingAttach& layout);
  ~StagingRegion();

  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;

  // The bytes [offset, offset + nbytes) of the data area; INVALID_ARGUMENT
  // naming the range when it does not lie inside the data area.
  absl::StatusOr<char*> Bytes(uint64_t offset, uint64_t nbytes) const;
  // Marks the chunk that starts at `offset` free again (clears the flag of
  // its first slot). A no-op for an offset that does not start a slot
  // inside the data area (Bytes has reported that range already).
  void Release(uint64_t offset);

  uint64_t data_bytes() const { return slot_bytes_ * slot_count_; }
  // The start of the data area (what a device backend pins for DMA).
  char* data() const { return base_ + data_offset_; }

 private:
  StagingRegion(char* base, uint64_t size, uint64_t slot_bytes, uint64_t slot_count,
                uint64_t data_offset)
      : base_(base),
        size_(size),
        slot_bytes_(slot_bytes),
        slot_count_(slot_count),
        data_offset_(data_offset) {}

  char* const base_;
  const uint64_t size_;
  const uint64_t slot_bytes_;
  const uint64_t slot_count_;
  const uint64_t data_offset_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_STAGING_REGION_H_
