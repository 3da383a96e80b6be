#include "attach_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "flagos/v1/wire.h"

namespace flagos::client {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Waits until `fd` is readable or `deadline` passes.
bool WaitReadable(int fd, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(ms));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

}  // namespace

absl::StatusOr<int> SendAttach(const std::string& socket_path, const v1::StagingAttach& attach,
                               int fd, absl::Time deadline) {
  std::string frame = v1::EncodeFrame(attach);

  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the staging socket path ", socket_path, " is too long"));
  }
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return Errno("staging attach: socket failed");
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{sock};
  if (connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return Errno(absl::StrCat("staging attach: cannot connect to ", socket_path));
  }
  iovec iov{frame.data(), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(sock, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) {
    return Errno("staging attach: sending the region failed");
  }
  std::string reply;
  const auto complete = [&reply] {
    if (reply.size() < 4) return false;
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) {
      length |= static_cast<uint32_t>(static_cast<uint8_t>(reply[i])) << (8 * i);
    }
    return reply.size() >= 4 + static_cast<uint64_t>(length);
  };
  while (!complete()) {
    if (!WaitReadable(sock, deadline)) {
      return absl::DeadlineExceededError("staging attach: flagosd did not answer in time");
    }
    char buffer[4096];
    const ssize_t got = recv(sock, buffer, sizeof(buffer), 0);
    if (got <= 0) return absl::UnavailableError("staging attach: flagosd closed the connection");
    reply.append(buffer, static_cast<size_t>(got));
    if (reply.size() > 8192) return absl::InternalError("staging attach: oversized answer");
  }
  v1::StagingAttached attached;
  if (!attached.ParseFromArray(reply.data() + 4, static_cast<int>(reply.size() - 4))) {
    return absl::InternalError("staging attach: flagosd's answer does not parse");
  }
  if (attached.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(attached.code()),
                        absl::StrCat("staging attach refused: ", attached.message()));
  }
  closer.fd = -1;
  return sock;
}

}  // namespace flagos::client
