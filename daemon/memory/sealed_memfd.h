// Mapping a client's shared-memory file (the staging region, pinned regions):
// a regular file, sealed against shrinking, at least as large as asked.
#ifndef FLAGOS_DAEMON_MEMORY_SEALED_MEMFD_H_
#define FLAGOS_DAEMON_MEMORY_SEALED_MEMFD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

// Maps `nbytes` of `fd` shared and read-write, and closes `fd` on every
// path. A file the client could shrink would fault the daemon when it
// touches the lost pages, so only a memfd sealed with F_SEAL_SHRINK is
// accepted. Errors start with `what` ("staging region") and name the size
// needed as `needed_by`'s ("the layout").
absl::StatusOr<char*> MapSealedMemfd(int fd, uint64_t nbytes, absl::string_view what,
                                     absl::string_view needed_by);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_MEMORY_SEALED_MEMFD_H_
