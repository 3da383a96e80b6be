#include "pinned_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "attach_socket.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

absl::StatusOr<std::unique_ptr<PinnedRegion>> PinnedRegion::Create(uint64_t id, uint64_t nbytes) {
  if (nbytes == 0) {
    return absl::InvalidArgumentError("pinned region: a region holds at least one byte");
  }
  const uint64_t size = (nbytes + 4095) / 4096 * 4096;
  const int fd = memfd_create("flagos-pinned", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinned region: memfd_create failed: ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = absl::ResourceExhaustedError(absl::StrCat(
        "pinned region: sizing or sealing a memfd of ", size, " bytes failed: ",
        std::strerror(errno)));
    close(fd);
    return s;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = absl::ResourceExhaustedError(
        absl::StrCat("pinned region: mapping ", size, " bytes failed: ", std::strerror(errno)));
    close(fd);
    return s;
  }
  return std::unique_ptr<PinnedRegion>(new PinnedRegion(id, fd, static_cast<char*>(base), size));
}

PinnedRegion::~PinnedRegion() {
  munmap(base_, nbytes_);
  close(fd_);
}

absl::Status PinnedRegion::Attach(const std::string& socket_path, uint64_t session_id,
                                  const std::string& token, absl::Time deadline) {
  v1::StagingAttach attach;
  attach.set_session_id(session_id);
  attach.set_token(token);
  attach.mutable_pinned()->set_id(id_);
  attach.mutable_pinned()->set_nbytes(nbytes_);
  absl::StatusOr<int> sock = SendAttach(socket_path, attach, fd_, deadline);
  if (!sock.ok()) return sock.status();
  close(*sock);  // a pinned attach ends with the answer
  return absl::OkStatus();
}

}  // namespace flagos::client
