// PinnedRegion (client side): one pinned host region of the session, a
// sealed memfd this process creates, maps and attaches to flagosd over the
// staging socket (flagos.proto, PinnedRegion). Pinned host tensors live in
// it; the daemon maps it too and copies straight from and into it. Only
// this process and the daemon hold the descriptor.
//
// Thread safety: immutable after Create and Attach.
#ifndef FLAGOS_CLIENT_SRC_PINNED_REGION_H_
#define FLAGOS_CLIENT_SRC_PINNED_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flagos::client {

class PinnedRegion {
 public:
  // A region of `nbytes` (> 0; rounded up to whole pages) under id `id`.
  static absl::StatusOr<std::unique_ptr<PinnedRegion>> Create(uint64_t id, uint64_t nbytes);
  // Unmaps this process's view; the daemon's mapping lives until it
  // releases the region.
  ~PinnedRegion();

  PinnedRegion(const PinnedRegion&) = delete;
  PinnedRegion& operator=(const PinnedRegion&) = delete;

  // Attaches the region to session `session_id` over the Unix socket
  // `socket_path` and waits (until `deadline`) for the daemon's answer.
  absl::Status Attach(const std::string& socket_path, uint64_t session_id,
                      const std::string& token, absl::Time deadline);

  uint64_t id() const { return id_; }
  char* data() const { return base_; }
  uint64_t nbytes() const { return nbytes_; }

 private:
  PinnedRegion(uint64_t id, int fd, char* base, uint64_t nbytes)
      : id_(id), fd_(fd), base_(base), nbytes_(nbytes) {}

  const uint64_t id_;
  const int fd_;
  char* const base_;
  const uint64_t nbytes_;
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_PINNED_REGION_H_
