// UnixAcceptor: a unix socket the daemon listens on and accepts from itself,
// handing each connection (non-blocking, close-on-exec) to a callback on
// its accept thread. The session socket uses it so that every connection's
// peer credentials can be read before gRPC serves it (gRPC does not expose
// them); the staging socket so that each attach is served on a thread of
// its own.
//
// Thread safety: Stop may be called from any thread; the callback runs on
// the accept thread only.
#ifndef FLAGOS_DAEMON_TRANSPORT_UNIX_ACCEPTOR_H_
#define FLAGOS_DAEMON_TRANSPORT_UNIX_ACCEPTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "transport/listen_endpoint.h"

namespace flagos::daemon {

class UnixAcceptor {
 public:
  // Takes ownership of each accepted descriptor.
  using OnAccept = std::function<void(int fd)>;

  // Listens on `endpoint.unix_path` (PrepareUnixSocket, then a socket
  // created owner-only and opened to `endpoint.mode` by SecureUnixSocket)
  // and starts accepting. `name` is for the log ("staging listener").
  static absl::StatusOr<std::unique_ptr<UnixAcceptor>> Start(const ListenEndpoint& endpoint,
                                                             std::string name,
                                                             OnAccept on_accept);
  // Stop().
  ~UnixAcceptor();

  UnixAcceptor(const UnixAcceptor&) = delete;
  UnixAcceptor& operator=(const UnixAcceptor&) = delete;

  const std::string& path() const { return path_; }

  // Stops accepting, joins the accept thread and removes the socket file.
  // Connections already handed on are not touched. Idempotent.
  void Stop();

 private:
  UnixAcceptor(std::string path, std::string name, int listen_fd, int wake_fd,
               OnAccept on_accept);
  void Run();

  const std::string path_;
  const std::string name_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd that ends Run
  const OnAccept on_accept_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_UNIX_ACCEPTOR_H_
