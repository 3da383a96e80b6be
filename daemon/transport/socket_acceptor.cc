#include "transport/socket_acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SocketAcceptor>> SocketAcceptor::StartUnix(
    const ListenEndpoint& endpoint, std::string name, OnAccept on_accept) {
  const std::string& path = endpoint.unix_path;
  if (absl::Status s = PrepareUnixSocket(endpoint); !s.ok()) return s;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the socket path ", path, " (", name, ") is longer than a unix socket's ",
        sizeof(address.sun_path) - 1, " bytes; choose a shorter --listen path"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno(absl::StrCat("cannot create the ", name, " socket"));
  // Created owner-only; SecureUnixSocket then opens it as far as its mode
  // says, so it is never wider open than that.
  const mode_t old_umask = umask(0177);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  umask(old_umask);
  if (bound != 0 || listen(fd, SOMAXCONN) != 0) {
    absl::Status s = Errno(absl::StrCat("cannot listen on ", path, " (", name, ")"));
    close(fd);
    return s;
  }
  if (absl::Status s = SecureUnixSocket(endpoint); !s.ok()) {
    close(fd);
    unlink(path.c_str());
    return s;
  }
  absl::StatusOr<std::unique_ptr<SocketAcceptor>> acceptor =
      Serve(path, std::move(name), fd, std::move(on_accept));
  if (!acceptor.ok()) unlink(path.c_str());
  return acceptor;
}

absl::StatusOr<std::unique_ptr<SocketAcceptor>> SocketAcceptor::StartTcp(const std::string& host,
                                                                         std::string name,
                                                                         OnAccept on_accept) {
  std::string numeric = host;
  if (numeric.size() >= 2 && numeric.front() == '[' && numeric.back() == ']') {
    numeric = numeric.substr(1, numeric.size() - 2);
  }
  sockaddr_storage address{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  if (inet_pton(AF_INET, numeric.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, numeric.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    length = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", name, " needs a numeric address to listen on, not '", host, "'"));
  }
  const int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno(absl::StrCat("cannot create the ", name, " socket"));
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    absl::Status s = Errno(absl::StrCat("cannot listen on ", host, " (", name, ")"));
    close(fd);
    return s;
  }
  const int port = ntohs(address.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  absl::StatusOr<std::unique_ptr<SocketAcceptor>> acceptor =
      Serve(std::string(), std::move(name), fd, std::move(on_accept));
  if (acceptor.ok()) (*acceptor)->port_ = port;
  return acceptor;
}

absl::StatusOr<std::unique_ptr<SocketAcceptor>> SocketAcceptor::Serve(std::string path,
                                                                      std::string name, int fd,
                                                                      OnAccept on_accept) {
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    absl::Status s = Errno(absl::StrCat("cannot create an eventfd for the ", name));
    close(fd);
    return s;
  }
  std::unique_ptr<SocketAcceptor> acceptor(
      new SocketAcceptor(std::move(path), std::move(name), fd, wake, std::move(on_accept)));
  acceptor->thread_ = std::thread(&SocketAcceptor::Run, acceptor.get());
  return acceptor;
}

SocketAcceptor::SocketAcceptor(std::string path, std::string name, int listen_fd, int wake_fd,
                               OnAccept on_accept)
    : path_(std::move(path)),
      name_(std::move(name)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      on_accept_(std::move(on_accept)) {}

SocketAcceptor::~SocketAcceptor() { Stop(); }

void SocketAcceptor::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  (void)write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  if (!path_.empty()) unlink(path_.c_str());
}

void SocketAcceptor::Run() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LogError(absl::StrCat(name_, ": poll failed: ", std::strerror(errno)));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: say so, and do not spin on the pending
      // connection.
      if (errno == EMFILE || errno == ENFILE) {
        LogWarning(absl::StrCat(name_, ": cannot accept a connection: ", std::strerror(errno)));
        usleep(100 * 1000);
      }
      continue;
    }
    on_accept_(fd);
  }
}

}  // namespace flagos::daemon
