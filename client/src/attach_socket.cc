#include "attach_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

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

// Reads the daemon's StagingAttached answer on `sock`; OK when it accepted.
absl::Status ReadAttachReply(int sock, absl::Time deadline, absl::string_view what,
                             v1::StagingAttached* accepted = nullptr) {
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
      return absl::DeadlineExceededError(absl::StrCat(what, ": flagosd did not answer in time"));
    }
    char buffer[4096];
    const ssize_t got = recv(sock, buffer, sizeof(buffer), 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) {
      return absl::UnavailableError(absl::StrCat(what, ": flagosd closed the connection"));
    }
    reply.append(buffer, static_cast<size_t>(got));
    if (reply.size() > 8192) return absl::InternalError(absl::StrCat(what, ": oversized answer"));
  }
  v1::StagingAttached attached;
  if (!attached.ParseFromArray(reply.data() + 4, static_cast<int>(reply.size() - 4))) {
    return absl::InternalError(absl::StrCat(what, ": flagosd's answer does not parse"));
  }
  if (attached.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(attached.code()),
                        absl::StrCat(what, " refused: ", attached.message()));
  }
  if (accepted != nullptr) *accepted = std::move(attached);
  return absl::OkStatus();
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
  if (absl::Status s = ReadAttachReply(sock, deadline, "staging attach"); !s.ok()) return s;
  closer.fd = -1;
  return sock;
}

absl::StatusOr<int> AttachSyncChannel(const std::string& host, uint32_t port,
                                      const v1::SyncAttach& attach, absl::Time deadline,
                                      uint32_t* max_waiting) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int r = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); r != 0) {
    return absl::UnavailableError(
        absl::StrCat("sync attach: cannot resolve ", host, ": ", gai_strerror(r)));
  }
  absl::Status failed = absl::UnavailableError(absl::StrCat("sync attach: no address for ", host));
  int sock = -1;
  for (addrinfo* a = found; a != nullptr && sock < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
      while (true) {  // until connected, refused or the deadline
        const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
        pollfd p{fd, POLLOUT, 0};
        const int r = ms > 0 ? poll(&p, 1, static_cast<int>(ms)) : 0;
        if (r < 0 && errno == EINTR) continue;
        int error = r > 0 ? 0 : ETIMEDOUT;
        socklen_t length = sizeof(error);
        if (r > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error == 0) {
          sock = fd;
        } else {
          errno = error;
        }
        break;
      }
    }
    if (sock < 0) {
      failed = Errno(absl::StrCat("sync attach: cannot connect to ", host, ":", port));
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (sock < 0) return failed;
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{sock};
  // One small request and one small reply at a time: Nagle's algorithm would
  // hold each back for the other side's delayed ack.
  const int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string frame = v1::EncodeFrame(attach);
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = send(sock, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{sock, POLLOUT, 0};
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms > 0 && poll(&p, 1, static_cast<int>(ms)) >= 0) continue;
    }
    return Errno("sync attach: sending the attach failed");
  }
  v1::StagingAttached accepted;
  if (absl::Status s = ReadAttachReply(sock, deadline, "sync attach", &accepted); !s.ok()) {
    return s;
  }
  *max_waiting = std::max<uint32_t>(accepted.max_sync_waiting(), 1);
  // The channel's calls block.
  fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) & ~O_NONBLOCK);
  closer.fd = -1;
  return sock;
}

}  // namespace flagos::client
