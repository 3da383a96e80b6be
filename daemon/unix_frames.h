// Length-prefixed protobuf frames on a Unix stream socket (the staging
// socket and the sync channel): a 4-byte little-endian length, then the
// message.
#ifndef FLAGOS_DAEMON_UNIX_FRAMES_H_
#define FLAGOS_DAEMON_UNIX_FRAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace flagos::daemon {

// Writes `message` as one frame; false when the peer is gone.
bool WriteFrame(int fd, const google::protobuf::MessageLite& message);

// Reads one frame's body into `body`. UNAVAILABLE when the peer closed the
// socket (or it was shut down), INVALID_ARGUMENT when the frame claims more
// than `max_bytes`.
absl::Status ReadFrame(int fd, uint32_t max_bytes, std::string* body);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_UNIX_FRAMES_H_
