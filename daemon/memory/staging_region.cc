#include "memory/staging_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "memory/sealed_memfd.h"

namespace flagos::daemon {

absl::StatusOr<std::unique_ptr<StagingRegion>> StagingRegion::Map(
    int fd, const v1::StagingAttach& layout) {
  absl::Cleanup close_fd = [fd] { close(fd); };  // on every refusal below
  const uint64_t slot_bytes = layout.slot_bytes();
  const uint64_t slot_count = layout.slot_count();
  const uint64_t data_offset = layout.data_offset();
  if (slot_bytes < kMinStagingSlotBytes || slot_bytes > kMaxStagingSlotBytes ||
      slot_bytes % kMinStagingSlotBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging region: slot_bytes ", slot_bytes, " must be a multiple of ",
        kMinStagingSlotBytes, " between ", kMinStagingSlotBytes, " and ", kMaxStagingSlotBytes));
  }
  if (slot_count == 0 || slot_count > kMaxStagingRegionBytes / slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging region: ", slot_count, " slots of ", slot_bytes,
        " bytes; the data area must be non-empty and at most ", kMaxStagingRegionBytes,
        " bytes"));
  }
  if (data_offset < slot_count || data_offset > kMaxStagingRegionBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging region: data_offset ", data_offset, " must follow the ", slot_count,
        " slot flags and be at most ", kMaxStagingRegionBytes));
  }
  const uint64_t needed = data_offset + slot_count * slot_bytes;
  std::move(close_fd).Cancel();  // MapSealedMemfd closes it
  absl::StatusOr<char*> base = MapSealedMemfd(fd, needed, "staging region", "the layout");
  if (!base.ok()) return base.status();
  return std::unique_ptr<StagingRegion>(
      new StagingRegion(*base, needed, slot_bytes, slot_count, data_offset));
}

StagingRegion::~StagingRegion() { munmap(base_, size_); }

absl::StatusOr<char*> StagingRegion::Bytes(uint64_t offset, uint64_t nbytes) const {
  if (offset > data_bytes() || nbytes > data_bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staged bytes [", offset, ", +", nbytes, ") lie outside the session's staging data area (",
        data_bytes(), " bytes)"));
  }
  return base_ + data_offset_ + offset;
}

void StagingRegion::Release(uint64_t offset) {
  if (offset % slot_bytes_ != 0 || offset / slot_bytes_ >= slot_count_) return;
  auto* flag = reinterpret_cast<uint8_t*>(base_ + offset / slot_bytes_);
  std::atomic_ref<uint8_t>(*flag).store(0, std::memory_order_release);
}

}  // namespace flagos::daemon
