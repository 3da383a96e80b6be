#include "memory/host_regions.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {

absl::Status HostRegions::AttachStaging(const v1::StagingAttach& attach, int fd) {
  {
    absl::MutexLock lock(&staging_mu_);
    if (staging_ != nullptr) {
      close(fd);
      return absl::AlreadyExistsError(
          absl::StrCat("session ", session_id_, " already has a staging region"));
    }
  }
  absl::StatusOr<std::unique_ptr<StagingRegion>> region = StagingRegion::Map(fd, attach);
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&staging_mu_);
  if (staging_ != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", session_id_, " already has a staging region"));
  }
  staging_ = *std::move(region);
  // Pinned for DMA where the backend can (a gap on the cpu backend, whose
  // copies are memcpy); copies work unpinned either way.
  staging_registered_ = runtime_->HostRegister(staging_->data(), staging_->data_bytes()).ok();
  return absl::OkStatus();
}

absl::Status HostRegions::AttachPinned(const v1::StagingAttach& attach, int fd) {
  const uint64_t id = attach.pinned().id();
  const uint64_t nbytes = attach.pinned().nbytes();
  absl::Status refused;
  if (id == 0) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        "session ", session_id_, ": pinned region id 0 is reserved; mint ids from 1"));
  } else {
    absl::MutexLock lock(&pinned_mu_);
    if (pinned_.contains(id)) {
      refused = absl::AlreadyExistsError(
          absl::StrCat("session ", session_id_, " already has pinned region ", id));
    } else if (pinned_.size() >= kMaxPinnedRegionsPerSession) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "session ", session_id_, " already has ", pinned_.size(),
          " pinned regions, the most flagosd allows; free pinned tensors (their cached blocks "
          "go back with the host allocator's empty_cache) or pin fewer, larger buffers"));
    } else if (nbytes > kMaxPinnedBytesPerSession - pinned_total_bytes_) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "session ", session_id_, ": pinning ", nbytes, " more bytes would exceed the ",
          kMaxPinnedBytesPerSession, " bytes of pinned host memory a session may hold (",
          pinned_total_bytes_, " pinned now)"));
    }
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  absl::StatusOr<std::unique_ptr<PinnedRegion>> region =
      PinnedRegion::Map(id, fd, nbytes, runtime_);
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&pinned_mu_);
  // Checked again: another attach of the session may have raced this one.
  if (pinned_.contains(id) || nbytes > kMaxPinnedBytesPerSession - pinned_total_bytes_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "session ", session_id_, ": pinned region ", id,
        " was attached concurrently, or the session's pinned bytes reached their bound "
        "meanwhile"));
  }
  pinned_total_bytes_ += nbytes;
  pinned_.emplace(id, *std::move(region));
  return absl::OkStatus();
}

bool HostRegions::has_staging() const {
  absl::MutexLock lock(&staging_mu_);
  return staging_ != nullptr;
}

uint64_t HostRegions::staging_bytes() const {
  absl::MutexLock lock(&staging_mu_);
  return staging_ == nullptr ? 0 : staging_->data_bytes();
}

uint64_t HostRegions::pinned_bytes() const {
  absl::MutexLock lock(&pinned_mu_);
  return pinned_total_bytes_;
}

uint64_t HostRegions::pinned_registered_bytes() const {
  absl::MutexLock lock(&pinned_mu_);
  uint64_t registered = 0;
  for (const auto& [id, region] : pinned_) {
    if (region->registered()) registered += region->nbytes();
  }
  return registered;
}

absl::StatusOr<std::shared_ptr<StagingRegion>> HostRegions::Staging(
    const v1::Command& command) const {
  absl::MutexLock lock(&staging_mu_);
  if (staging_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "command ", command.seq(), " (", CommandKindName(command),
        ") names staged bytes but the session has no staging region; attach one first (or send "
        "the bytes inline)"));
  }
  return staging_;
}

absl::StatusOr<std::shared_ptr<PinnedRegion>> HostRegions::Pinned(const v1::Command& command,
                                                                  uint64_t region) const {
  absl::MutexLock lock(&pinned_mu_);
  auto it = pinned_.find(region);
  if (it == pinned_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "command ", command.seq(), " (", CommandKindName(command), ") names pinned region ",
        region, ", which session ", session_id_, " has not attached (or has released)"));
  }
  return it->second;
}

bool HostRegions::ReleasePinned(uint64_t region) {
  std::shared_ptr<PinnedRegion> released;  // unmapped outside the lock when the last
  absl::MutexLock lock(&pinned_mu_);
  auto it = pinned_.find(region);
  if (it == pinned_.end()) return false;
  pinned_total_bytes_ -= it->second->nbytes();
  released = std::move(it->second);
  pinned_.erase(it);
  return true;
}

void HostRegions::ReleaseStagedUpload(const v1::Command& command) {
  if (!command.has_copy_to_device() || !command.copy_to_device().has_staged()) return;
  absl::MutexLock lock(&staging_mu_);
  if (staging_ != nullptr) staging_->Release(command.copy_to_device().staged().offset());
}

void HostRegions::Close() {
  {
    absl::MutexLock lock(&staging_mu_);
    if (staging_ != nullptr && staging_registered_) {
      (void)runtime_->HostUnregister(staging_->data());
      staging_registered_ = false;
    }
  }
  // Every copy that used a region has completed: this unmaps them.
  absl::flat_hash_map<uint64_t, std::shared_ptr<PinnedRegion>> pinned;
  {
    absl::MutexLock lock(&pinned_mu_);
    pinned.swap(pinned_);
    pinned_total_bytes_ = 0;
  }
}

}  // namespace flagos::daemon
