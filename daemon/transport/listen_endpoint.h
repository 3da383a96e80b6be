// --listen endpoints: parsing, and the unix-socket file housekeeping gRPC
// does not do (parent directory, stale socket files, permissions).
#ifndef FLAGOS_DAEMON_TRANSPORT_LISTEN_ENDPOINT_H_
#define FLAGOS_DAEMON_TRANSPORT_LISTEN_ENDPOINT_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

inline constexpr char kDefaultListen[] = "unix:///run/flagosd/flagosd.sock";

struct ListenEndpoint {
  std::string uri;        // what gRPC listens on
  std::string unix_path;  // the socket file; empty for TCP
  // Socket file mode: 0660 for the system socket (kDefaultListen's path,
  // however spelled; shared with the `flagos` group), 0600 (owner only) for
  // any other path.
  mode_t mode = 0600;
  // TCP on localhost, an IPv4 address 127.x.x.x or [::1].
  bool loopback = false;
};

// Accepts "unix:///abs/path", "unix:/abs/path", "unix:relative/path" and
// TCP "host:port" (which needs TLS, or --insecure-tcp on loopback:
// remote_access.h). INVALID_ARGUMENT naming the endpoint otherwise.
absl::StatusOr<ListenEndpoint> ParseListenEndpoint(absl::string_view spec);

// Before listening on a unix socket: creates the parent directory (0755)
// and removes a stale socket file no process listens on. FAILED_PRECONDITION
// when another process listens there or the path is not a socket.
absl::Status PrepareUnixSocket(const ListenEndpoint& endpoint);

// After listening: sets the socket file's mode (and for the system socket
// its group to `flagos` when that group exists).
absl::Status SecureUnixSocket(const ListenEndpoint& endpoint);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_LISTEN_ENDPOINT_H_
