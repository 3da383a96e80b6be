// The host memory one session attached (the data plane, docs/protocol.md):
// its staging region (at most one, attached once) and its pinned host
// regions by id. Commands take a reference to a region while they use it,
// so a region released or detached stays mapped until the last copy that
// uses it has completed.
//
// The session checks who attaches (the token, the uid); this class checks
// what: one staging region, pinned ids and the session's bounds
// (kMaxPinnedRegionsPerSession, kMaxPinnedBytesPerSession).
//
// Thread safety: every method may be called from any thread. staging_mu_
// and pinned_mu_ are leaves and never held together.
#ifndef FLAGOS_DAEMON_MEMORY_HOST_REGIONS_H_
#define FLAGOS_DAEMON_MEMORY_HOST_REGIONS_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "flagos/runtime.h"
#include "flagos/v1/flagos.pb.h"
#include "memory/pinned_region.h"
#include "memory/staging_region.h"

namespace flagos::daemon {

class HostRegions {
 public:
  // `runtime` registers the regions for DMA and must outlive them;
  // `session_id` names the session in errors.
  HostRegions(uint64_t session_id, DeviceRuntime* runtime)
      : session_id_(session_id), runtime_(runtime) {}

  HostRegions(const HostRegions&) = delete;
  HostRegions& operator=(const HostRegions&) = delete;

  // Maps the staging region (StagingRegion::Map) and registers it for DMA
  // where the backend can. Closes `fd`. ALREADY_EXISTS when a region is
  // attached already.
  absl::Status AttachStaging(const v1::StagingAttach& attach, int fd);
  // Maps pinned region `attach.pinned()` (PinnedRegion::Map): checks the id
  // (> 0, not attached yet) and the session's bounds first. Closes `fd`.
  absl::Status AttachPinned(const v1::StagingAttach& attach, int fd);

  bool has_staging() const;
  // Bytes of the attached staging region (0: none).
  uint64_t staging_bytes() const;
  // Bytes of the pinned host regions attached now, and of those the backend
  // registered for DMA.
  uint64_t pinned_bytes() const;
  uint64_t pinned_registered_bytes() const;

  // The attached staging region; FAILED_PRECONDITION naming the command
  // when there is none.
  absl::StatusOr<std::shared_ptr<StagingRegion>> Staging(const v1::Command& command) const;
  // Pinned region `region`, named by `command`; NOT_FOUND naming both when
  // the session has no such region.
  absl::StatusOr<std::shared_ptr<PinnedRegion>> Pinned(const v1::Command& command,
                                                       uint64_t region) const;
  // Forgets pinned region `region` (unmapped once no copy holds it); false
  // when there is none.
  bool ReleasePinned(uint64_t region);
  // Frees the staging chunk of a staged copy_to_device that will not run.
  void ReleaseStagedUpload(const v1::Command& command);
  // The session closes (every copy has completed): unregisters the staging
  // region and unmaps every pinned region.
  void Close();

 private:
  const uint64_t session_id_;
  DeviceRuntime* const runtime_;

  // Set once by AttachStaging.
  mutable absl::Mutex staging_mu_;
  std::shared_ptr<StagingRegion> staging_ ABSL_GUARDED_BY(staging_mu_);
  bool staging_registered_ ABSL_GUARDED_BY(staging_mu_) = false;

  mutable absl::Mutex pinned_mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PinnedRegion>> pinned_
      ABSL_GUARDED_BY(pinned_mu_);
  uint64_t pinned_total_bytes_ ABSL_GUARDED_BY(pinned_mu_) = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_HOST_REGIONS_H_
