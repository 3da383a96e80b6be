// The attach exchanges with flagosd (flagos.proto). SendAttach, on the
// staging socket (StagingAttach): connect, send the length-prefixed
// StagingAttach with a memfd as SCM_RIGHTS, read the length-prefixed
// StagingAttached; used for the staging region (whose connection then stays
// open as the sync channel) and for pinned host regions. AttachSyncChannel,
// a TCP session's (SyncAttach): connect to the daemon's sync port, send the
// SyncAttach, read the StagingAttached; the connection is the sync channel.
//
// Thread safety: a free function; calls are independent.
#ifndef FLAGOS_CLIENT_SRC_ATTACH_SOCKET_H_
#define FLAGOS_CLIENT_SRC_ATTACH_SOCKET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

// Sends `attach` with descriptor `fd` (not taken) to the Unix socket
// `socket_path` and waits until `deadline` for the daemon's answer. On
// acceptance returns the connected socket (the caller owns it); else the
// daemon's refusal as a status (its code, "staging attach refused: ...") or
// why no answer came.
absl::StatusOr<int> SendAttach(const std::string& socket_path, const v1::StagingAttach& attach,
                               int fd, absl::Time deadline);

// Connects to `host`:`port` (TCP_NODELAY), sends `attach` and waits until
// `deadline` for the daemon's answer. On acceptance returns the connected,
// blocking socket (the caller owns it) and sets `*max_waiting` to how many
// commands may wait for replies on it at once (1 from a daemon that does
// not say); else the refusal ("sync attach refused: ...") or why no answer
// came.
absl::StatusOr<int> AttachSyncChannel(const std::string& host, uint32_t port,
                                      const v1::SyncAttach& attach, absl::Time deadline,
                                      uint32_t* max_waiting);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_ATTACH_SOCKET_H_
