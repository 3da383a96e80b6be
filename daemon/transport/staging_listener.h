// StagingListener: the Unix socket on which same-node clients attach their
// shared staging region to their session (flagos.proto, StagingAttach).
//
// One connection per attach: the client sends a length-prefixed
// StagingAttach with its memfd as SCM_RIGHTS, the listener finds the session
// by id, checks the session's token (which only the session's own stream
// carried) and maps the region, then answers with StagingAttached. The
// connection of a successful staging attach becomes the session's sync
// channel; an attach of a pinned host region (StagingAttach.pinned) ends
// with the answer. The
// socket file lives next to the daemon's first unix --listen socket, with
// the same mode.
//
// Attaches are served concurrently (at most kMaxConcurrentAttaches at once;
// one more is closed at once) and each must complete within
// kAttachDeadlineSeconds from its accept, so a client that connects and
// drips bytes holds neither the listener nor anyone else's attach.
//
// Thread safety: Stop may be called from any thread; one thread accepts,
// one thread per attach in progress serves.
#ifndef FLAGOS_DAEMON_TRANSPORT_STAGING_LISTENER_H_
#define FLAGOS_DAEMON_TRANSPORT_STAGING_LISTENER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flagos::daemon {

class SessionRegistry;
class UnixAcceptor;

inline constexpr int kMaxConcurrentAttaches = 16;
inline constexpr int kAttachDeadlineSeconds = 5;

class StagingListener {
 public:
  // Listens on `path` (a stale socket file there is replaced) with file mode
  // `mode`. `registry` must outlive the listener.
  static absl::StatusOr<std::unique_ptr<StagingListener>> Start(std::string path, mode_t mode,
                                                                SessionRegistry* registry);
  // Stop().
  ~StagingListener();

  StagingListener(const StagingListener&) = delete;
  StagingListener& operator=(const StagingListener&) = delete;

  const std::string& path() const { return path_; }

  // Stops serving, waits for the attaches in progress (each ends by its
  // deadline) and removes the socket file. Idempotent.
  void Stop();

 private:
  StagingListener(std::string path, SessionRegistry* registry);
  // An accepted connection: served on a thread of its own, or closed when
  // kMaxConcurrentAttaches are in progress.
  void Accepted(int fd);
  // Handles one attach connection (closes `fd`, or hands it to the
  // session as its sync channel), within the attach deadline.
  void Serve(int fd);

  const std::string path_;
  SessionRegistry& registry_;
  std::unique_ptr<UnixAcceptor> acceptor_;
  // A leaf: attaches are served (Session::AttachStaging ...) without it.
  absl::Mutex mu_;
  int attaching_ ABSL_GUARDED_BY(mu_) = 0;  // Serve calls in progress
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_STAGING_LISTENER_H_
