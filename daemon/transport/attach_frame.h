// The one-frame exchange that opens an attach connection (flagos.proto:
// StagingAttach on the staging socket, SyncAttach on the TCP sync
// listener): a length-prefixed request, read within a deadline from a
// non-blocking socket (with the descriptor a staging attach sends as
// SCM_RIGHTS), and the length-prefixed StagingAttached answer.
//
// Thread safety: free functions; calls on different sockets are independent.
#ifndef FLAGOS_DAEMON_TRANSPORT_ATTACH_FRAME_H_
#define FLAGOS_DAEMON_TRANSPORT_ATTACH_FRAME_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flagos::daemon {

// An attach message is a few dozen bytes; anything larger is not a client.
inline constexpr uint32_t kMaxAttachBytes = 4096;
// Each listener serves at most this many attaches at once (one more is
// closed at once), and each must complete within kAttachDeadlineSeconds of
// its accept, so a client that connects and drips bytes holds neither the
// listener nor anyone else's attach.
inline constexpr int kMaxConcurrentAttaches = 16;
inline constexpr int kAttachDeadlineSeconds = 5;

// The frame's body. `received_fd` (may be null) gets the first descriptor
// that came with it (-1: none; the caller owns it, also when the read
// fails); others are closed. DEADLINE_EXCEEDED when the frame is not
// complete kAttachDeadlineSeconds after `accepted`, INVALID_ARGUMENT when
// the connection ends early or the frame claims more than kMaxAttachBytes.
absl::StatusOr<std::string> ReadAttachFrame(int fd, absl::Time accepted, int* received_fd);

// Answers with StagingAttached{status}. False when the socket did not take
// it (a few bytes into an empty socket buffer: it does not block).
bool SendAttachReply(int fd, const absl::Status& status);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_ATTACH_FRAME_H_
