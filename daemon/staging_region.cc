#include "staging_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

// Closes the descriptor on every path out of Map.
struct FdCloser {
  int fd;
  ~FdCloser() { close(fd); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<StagingRegion>> StagingRegion::Map(
    int fd, const v1::StagingAttach& layout) {
  FdCloser closer{fd};
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
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging region: fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging region: the file sent holds ", info.st_size, " bytes; the layout needs ",
        needed));
  }
  // A file the client could shrink would fault the daemon when it touches
  // the lost pages: only a memfd sealed against shrinking is accepted.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "staging region: the file sent is not a memfd sealed with F_SEAL_SHRINK; create it with "
        "memfd_create(MFD_ALLOW_SEALING) and seal it before attaching");
  }
  void* base = mmap(nullptr, needed, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("staging region: mapping ", needed,
                                                     " bytes failed: ", std::strerror(errno)));
  }
  return std::unique_ptr<StagingRegion>(new StagingRegion(static_cast<char*>(base), needed,
                                                          slot_bytes, slot_count, data_offset));
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
