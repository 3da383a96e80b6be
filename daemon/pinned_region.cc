#include "pinned_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

absl::StatusOr<std::unique_ptr<PinnedRegion>> PinnedRegion::Map(uint64_t id, int fd,
                                                                uint64_t nbytes,
                                                                DeviceRuntime* runtime) {
  FdCloser closer{fd};
  if (nbytes == 0 || nbytes > kMaxPinnedRegionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("pinned region ", id, ": ", nbytes,
                                                   " bytes; a region holds 1 to ",
                                                   kMaxPinnedRegionBytes, " bytes"));
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned region ", id, ": fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) < nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("pinned region ", id, ": the file sent holds ",
                                                   info.st_size, " bytes; the region needs ",
                                                   nbytes));
  }
  // A file the client could shrink would fault the daemon when it touches
  // the lost pages: only a memfd sealed against shrinking is accepted.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned region ", id,
        ": the file sent is not a memfd sealed with F_SEAL_SHRINK; create it with "
        "memfd_create(MFD_ALLOW_SEALING) and seal it before attaching"));
  }
  void* base = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned region ", id, ": mapping ", nbytes, " bytes failed: ", std::strerror(errno)));
  }
  // Registered for DMA where the backend can (a gap on the cpu backend,
  // whose copies are memcpy); copies work unregistered either way.
  const bool registered = runtime->HostRegister(base, nbytes).ok();
  return std::unique_ptr<PinnedRegion>(
      new PinnedRegion(id, static_cast<char*>(base), nbytes, runtime, registered));
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
