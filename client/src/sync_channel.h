// SyncChannel: the session's fast path for synchronous commands (flagos.proto, SyncRequest): length-prefixed frames on the Unix
// socket the staging region was attached over, or on a TCP session's
// SyncAttach connection (where bulk bytes may travel raw after a frame:
// SyncRequest and Completion's payload_bytes). A round trip is one write
// and one blocking read in the calling thread, with no gRPC threads in
// between.
//
// Thread safety: Call is not reentrant; the owner serialises it. Shutdown
// may be called from any thread and makes a blocked Call return.
#ifndef FLAGOS_CLIENT_SRC_SYNC_CHANNEL_H_
#define FLAGOS_CLIENT_SRC_SYNC_CHANNEL_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::client {

class SyncChannel {
 public:
  // Takes the connected socket `fd`.
  explicit SyncChannel(int fd) : fd_(fd) {}
  ~SyncChannel();

  SyncChannel(const SyncChannel&) = delete;
  SyncChannel& operator=(const SyncChannel&) = delete;

  // Sends `request` (then `payload`, raw: request.payload_bytes() must be
  // its size), returns the daemon's Completion. A reply's raw payload
  // (Completion.payload_bytes) is read into `into` when it has that size,
  // else into the completion's data. UNAVAILABLE when the channel is closed
  // (the daemon ended the session or Shutdown was called).
  absl::StatusOr<v1::Completion> Call(const v1::SyncRequest& request,
                                      absl::Span<const char> payload = {},
                                      absl::Span<char> into = {});

  // Call's halves, for a pipelined copy that sends a request before it
  // reads the reply to the one before (the daemon keeps up to two waiting:
  // kMaxSyncWaiting). Replies arrive in the order of the requests.
  absl::Status Send(const v1::SyncRequest& request, absl::Span<const char> payload = {});
  absl::StatusOr<v1::Completion> Receive(absl::Span<char> into = {});

  void Shutdown();

 private:
  const int fd_;
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_SYNC_CHANNEL_H_
