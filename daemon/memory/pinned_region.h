// PinnedRegion: the daemon's mapping of one pinned host region of a
// session (a sealed memfd the client created and attached; see
// PinnedRegion in flagos.proto). Pinned host tensors live there, and the
// daemon copies straight from and into it.
//
// Every range the daemon touches is checked against the region, and the
// memfd must be sealed against shrinking, so no client action can make the
// daemon touch memory outside the mapping (or fault on a truncated file).
// The mapping is registered for DMA with the backend where it can be (the
// host_register slot) and unregistered and unmapped when the last
// reference goes: a copy still in flight holds one.
//
// Thread safety: all methods may be called concurrently.
#ifndef FLAGOS_DAEMON_MEMORY_PINNED_REGION_H_
#define FLAGOS_DAEMON_MEMORY_PINNED_REGION_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "flagos/runtime.h"

namespace flagos::daemon {

// Bounds on what a client may pin: one region, and all of one session's.
inline constexpr uint64_t kMaxPinnedRegionBytes = 16ull << 30;
inline constexpr uint64_t kMaxPinnedBytesPerSession = 64ull << 30;
inline constexpr uint64_t kMaxPinnedRegionsPerSession = 4096;

class PinnedRegion {
 public:
  // Checks the memfd `fd` (a regular file sealed with F_SEAL_SHRINK, at
  // least `nbytes` long) and maps `nbytes` of it. Always closes `fd`.
  // INVALID_ARGUMENT (what is wrong, what to send instead) when it does not
  // qualify or `nbytes` is 0 or above kMaxPinnedRegionBytes. `runtime`
  // (which must outlive the region) registers the mapping for DMA; a
  // backend without the slot copies from it unregistered.
  static absl::StatusOr<std::unique_ptr<PinnedRegion>> Map(uint64_t id, int fd, uint64_t nbytes,
                                                           DeviceRuntime* runtime);
  ~PinnedRegion();

  PinnedRegion(const PinnedRegion&) = delete;
  PinnedRegion& operator=(const PinnedRegion&) = delete;

  // The bytes [offset, offset + nbytes) of the region; INVALID_ARGUMENT
  // naming the range and the region when they do not lie inside it.
  absl::StatusOr<char*> Bytes(uint64_t offset, uint64_t nbytes) const;

  uint64_t id() const { return id_; }
  uint64_t nbytes() const { return nbytes_; }
  bool registered() const { return registered_; }

 private:
  PinnedRegion(uint64_t id, char* base, uint64_t nbytes, DeviceRuntime* runtime, bool registered)
      : id_(id), base_(base), nbytes_(nbytes), runtime_(runtime), registered_(registered) {}

  const uint64_t id_;
  char* const base_;
  const uint64_t nbytes_;
  DeviceRuntime* const runtime_;
  const bool registered_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_PINNED_REGION_H_
