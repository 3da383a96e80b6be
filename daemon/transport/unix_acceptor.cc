#include "transport/unix_acceptor.h"

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

absl::StatusOr<std::unique_ptr<UnixAcceptor>> UnixAcceptor::Start(const ListenEndpoint& endpoint,
                                                                  std::string name,
                                                                  OnAccept on_accept) {
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
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    absl::Status s = Errno(absl::StrCat("cannot create an eventfd for the ", name));
    close(fd);
    unlink(path.c_str());
    return s;
  }
  std::unique_ptr<UnixAcceptor> acceptor(
      new UnixAcceptor(path, std::move(name), fd, wake, std::move(on_accept)));
  acceptor->thread_ = std::thread(&UnixAcceptor::Run, acceptor.get());
  return acceptor;
}

UnixAcceptor::UnixAcceptor(std::string path, std::string name, int listen_fd, int wake_fd,
                           OnAccept on_accept)
    : path_(std::move(path)),
      name_(std::move(name)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      on_accept_(std::move(on_accept)) {}

UnixAcceptor::~UnixAcceptor() { Stop(); }

void UnixAcceptor::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  (void)write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void UnixAcceptor::Run() {
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
