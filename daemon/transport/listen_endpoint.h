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

// The group the system socket is given unless --socket-group says otherwise:
// the unit's Group= and the package's postinst's `addgroup --system flagos`.
inline constexpr char kDefaultSocketGroup[] = "flagos";

struct ListenEndpoint {
  std::string uri;        // what gRPC listens on
  std::string unix_path;  // the socket file; empty for TCP
  // The system socket (kDefaultListen's path, however spelled).
  bool system_socket = false;
  // Socket file mode: 0660 for the system socket (kDefaultListen's path,
  // however spelled; shared with the `flagos` group), 0600 (owner only) for
  // any other path.
  mode_t mode = 0600;
  // The group the socket file is given (--socket-group), resolved at start
  // by ResolveSocketGroup; empty: the file keeps the daemon's own group.
  std::string group;
  gid_t gid = static_cast<gid_t>(-1);
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

// Names the group `endpoint`'s socket file is given: sets `group` and
// `gid`; an empty `group` gives it none. FAILED_PRECONDITION naming the
// group, the socket and the fix (`addgroup --system NAME`, or another
// --socket-group) when no such group exists: a socket nobody but root may
// open is a failed start, not a warning. A no-op for TCP endpoints.
absl::Status ResolveSocketGroup(ListenEndpoint& endpoint, absl::string_view group);

// After listening: sets the socket file's mode and, when the endpoint has
// one (ResolveSocketGroup), its group.
absl::Status SecureUnixSocket(const ListenEndpoint& endpoint);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_LISTEN_ENDPOINT_H_
