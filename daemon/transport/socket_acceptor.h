// SocketAcceptor: a socket the daemon listens on and accepts from itself,
// handing each connection (non-blocking, close-on-exec) to a callback on
// its accept thread. Unix sockets: the session socket uses it so that every
// connection's peer credentials can be read before gRPC serves it (gRPC
// does not expose them); the staging socket so that each attach is served
// on a thread of its own. TCP: the sync listener of TCP sessions.
//
// Thread safety: Stop may be called from any thread; the callback runs on
// the accept thread only.
#ifndef FLAGOS_DAEMON_TRANSPORT_SOCKET_ACCEPTOR_H_
#define FLAGOS_DAEMON_TRANSPORT_SOCKET_ACCEPTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "transport/listen_endpoint.h"

namespace flagos::daemon {

class SocketAcceptor {
 public:
  // Takes ownership of each accepted descriptor.
  using OnAccept = std::function<void(int fd)>;

  // Listens on `endpoint.unix_path` (PrepareUnixSocket, then a socket
  // created owner-only and opened to `endpoint.mode` by SecureUnixSocket)
  // and starts accepting. `name` is for the log ("staging listener").
  static absl::StatusOr<std::unique_ptr<SocketAcceptor>> StartUnix(
      const ListenEndpoint& endpoint, std::string name, OnAccept on_accept);
  // Listens on TCP at the numeric address `host` (IPv4, or IPv6 with or
  // without brackets), on an ephemeral port (port()), and starts accepting.
  static absl::StatusOr<std::unique_ptr<SocketAcceptor>> StartTcp(const std::string& host,
                                                                  std::string name,
                                                                  OnAccept on_accept);
  // Stop().
  ~SocketAcceptor();

  SocketAcceptor(const SocketAcceptor&) = delete;
  SocketAcceptor& operator=(const SocketAcceptor&) = delete;

  // The socket file; empty for TCP.
  const std::string& path() const { return path_; }
  // The TCP port; 0 for a unix socket.
  int port() const { return port_; }

  // Stops accepting, joins the accept thread and removes the socket file.
  // Connections already handed on are not touched. Idempotent.
  void Stop();

 private:
  SocketAcceptor(std::string path, std::string name, int listen_fd, int wake_fd,
                 OnAccept on_accept);
  // Starts the accept thread on the listening `fd` (taken; closed on failure).
  static absl::StatusOr<std::unique_ptr<SocketAcceptor>> Serve(std::string path,
                                                               std::string name, int fd,
                                                               OnAccept on_accept);
  void Run();

  const std::string path_;
  const std::string name_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd that ends Run
  const OnAccept on_accept_;
  int port_ = 0;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_SOCKET_ACCEPTOR_H_
