#include "memory/sealed_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

struct FdCloser {
  int fd;
  ~FdCloser() { close(fd); }
};

}  // namespace

absl::StatusOr<char*> MapSealedMemfd(int fd, uint64_t nbytes, absl::string_view what,
                                     absl::string_view needed_by) {
  FdCloser closer{fd};
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) < nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the file sent holds ", info.st_size,
                                                   " bytes; ", needed_by, " needs ", nbytes));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": the file sent is not a memfd sealed with F_SEAL_SHRINK; create it with "
        "memfd_create(MFD_ALLOW_SEALING) and seal it before attaching"));
  }
  void* base = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": mapping ", nbytes, " bytes failed: ", std::strerror(errno)));
  }
  return static_cast<char*>(base);
}

}  // namespace flagos::daemon
