// AttachListener: where clients attach things to their session.
//
// The staging socket (StartStaging), a Unix socket, for same-node clients
// (flagos.proto, StagingAttach): the client sends a length-prefixed
// StagingAttach with a memfd as SCM_RIGHTS, the listener finds the session
// by id, checks the session's token (which only the session's own stream
// carried) and maps the region, then answers with StagingAttached. The
// connection of a successful staging attach becomes the session's sync
// channel; an attach of a pinned host region (StagingAttach.pinned) ends
// with the answer. The socket file lives next to the daemon's first unix
// --listen socket, with the same mode and group.
//
// The sync listener (StartSync), on TCP beside a plaintext loopback TCP
// --listen endpoint (--insecure-tcp), for TCP clients (SyncAttach): the
// client sends a length-prefixed SyncAttach, the listener checks the
// session's token and answers with StagingAttached; the connection is the
// session's sync channel from then on (TCP_NODELAY).
//
// Attaches are served concurrently, within attach_frame.h's bounds
// (kMaxConcurrentAttaches, kAttachDeadlineSeconds).
//
// Thread safety: Stop may be called from any thread; one thread accepts,
// one thread per attach in progress serves.
#ifndef FLAGOS_DAEMON_TRANSPORT_ATTACH_LISTENER_H_
#define FLAGOS_DAEMON_TRANSPORT_ATTACH_LISTENER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/attach_frame.h"
#include "transport/listen_endpoint.h"

namespace flagos::daemon {

class SessionRegistry;
class SocketAcceptor;

class AttachListener {
 public:
  // Listens on `path` (a stale socket file there is replaced) with the file
  // mode and group of `session_socket`, the socket it serves attaches for.
  // `registry` must outlive the listener.
  static absl::StatusOr<std::unique_ptr<AttachListener>> StartStaging(
      std::string path, const ListenEndpoint& session_socket, SessionRegistry* registry);
  // Listens on TCP at `host` (the numeric address of a TCP --listen
  // endpoint), on an ephemeral port (port()).
  static absl::StatusOr<std::unique_ptr<AttachListener>> StartSync(const std::string& host,
                                                                   SessionRegistry* registry);
  // Stop().
  ~AttachListener();

  AttachListener(const AttachListener&) = delete;
  AttachListener& operator=(const AttachListener&) = delete;

  // The staging socket's path (empty for the sync listener).
  const std::string& path() const { return path_; }
  // The sync listener's TCP port (0 for the staging socket).
  int port() const;

  // Stops serving, waits for the attaches in progress (each ends by its
  // deadline) and removes the socket file. Idempotent.
  void Stop();

 private:
  enum class Kind { kStaging, kSync };
  AttachListener(Kind kind, std::string path, SessionRegistry* registry);
  // An accepted connection: served on a thread of its own, or closed when
  // kMaxConcurrentAttaches are in progress.
  void Accepted(int fd);
  // Handle one attach connection (close `fd`, or hand it to the session as
  // its sync channel), within the attach deadline.
  void ServeStaging(int fd);
  void ServeSync(int fd);

  const Kind kind_;
  const std::string path_;
  SessionRegistry& registry_;
  std::unique_ptr<SocketAcceptor> acceptor_;
  // A leaf: attaches are served (Session::AttachStaging ...) without it.
  absl::Mutex mu_;
  int attaching_ ABSL_GUARDED_BY(mu_) = 0;  // Serve calls in progress
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_ATTACH_LISTENER_H_
