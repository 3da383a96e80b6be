#include "memory/pinned_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "memory/sealed_memfd.h"

namespace flagos::daemon {

absl::StatusOr<std::unique_ptr<PinnedRegion>> PinnedRegion::Map(uint64_t id, int fd,
                                                                uint64_t nbytes,
                                                                DeviceRuntime* runtime) {
  if (nbytes == 0 || nbytes > kMaxPinnedRegionBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("pinned region ", id, ": ", nbytes,
                                                   " bytes; a region holds 1 to ",
                                                   kMaxPinnedRegionBytes, " bytes"));
  }
  absl::StatusOr<char*> base =
      MapSealedMemfd(fd, nbytes, absl::StrCat("pinned region ", id), "the region");
  if (!base.ok()) return base.status();
  // Registered for DMA where the backend can (a gap on the cpu backend,
  // whose copies are memcpy); copies work unregistered either way.
  const bool registered = runtime->HostRegister(*base, nbytes).ok();
  return std::unique_ptr<PinnedRegion>(
      new PinnedRegion(id, *base, nbytes, runtime, registered));
}

PinnedRegion::~PinnedRegion() {
  if (registered_) (void)runtime_->HostUnregister(base_);
  munmap(base_, nbytes_);
}

absl::StatusOr<char*> PinnedRegion::Bytes(uint64_t offset, uint64_t nbytes) const {
  if (offset > nbytes_ || nbytes > nbytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("pinned bytes [", offset, ", +", nbytes,
                                                   ") lie outside pinned region ", id_, " (",
                                                   nbytes_, " bytes)"));
  }
  return base_ + offset;
}

}  // namespace flagos::daemon
