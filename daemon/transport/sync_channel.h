// A session's sync channel (SyncRequest in flagos.proto): the staging
// attach connection (or a TCP client's SyncAttach connection), carrying
// synchronous commands — at most kMaxSyncWaiting waiting for their replies
// at once (a TCP client's pipelined bulk copy has two) — read by a thread of
// its own; the reply to a command waiting there goes back on it (sent without blocking by the
// session's ReplyWriter), every other reply to the session stream. A
// request's raw payload (SyncRequest.payload_bytes) is read into its
// copy_to_device's data before the handler runs; with `raw_payloads`, a
// reply's data is sent raw after its frame (Completion.payload_bytes).
//
// The channel reads frames and routes replies; what a request means (when
// it may dispatch, what it may be) is the session's Handler.
//
// Thread safety: Start, Stop and CloseFd from the session's dispatching or
// closing thread (Start under the session's dispatch_mu_), Detach from its
// reading thread, Answer and Write from any thread. mu_ is a leaf: the
// handler runs without it.
#ifndef FLAGOS_DAEMON_TRANSPORT_SYNC_CHANNEL_H_
#define FLAGOS_DAEMON_TRANSPORT_SYNC_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "flagos/v1/flagos.pb.h"
#include "transport/owned_bytes.h"
#include "transport/reply_writer.h"

namespace flagos::daemon {

// Commands that may wait for their replies on one sync channel at once.
inline constexpr int kMaxSyncWaiting = 2;

class SyncChannel {
 public:
  // Handles one request on the channel's thread; false ends the channel
  // (the session is closing).
  using Handler = std::function<bool(v1::SyncRequest& request)>;

  // `replies` (the session's writer) must outlive the channel.
  SyncChannel(uint64_t session_id, ReplyWriter* replies)
      : session_id_(session_id), replies_(replies) {}
  // Stop() must have returned.
  ~SyncChannel() = default;

  SyncChannel(const SyncChannel&) = delete;
  SyncChannel& operator=(const SyncChannel&) = delete;

  // Serves `fd` from a thread of its own, calling `handle` for each request,
  // until the client closes it, a frame is not a request, or Stop. Takes
  // `fd`: closes it at once when the channel was detached or started
  // already.
  void Start(int fd, Handler handle, bool raw_payloads = false);
  // The client is gone: the channel's reads end and a send the writer has
  // in progress fails (the client may not read). The descriptor stays open
  // until CloseFd.
  void Detach();
  // Ends the thread's read and joins it. The descriptor stays open (so its
  // number cannot be reused by another session's connection) until CloseFd.
  void Stop();
  // Closes the descriptor; once no reply can be sent on it (the writer has
  // finished).
  void CloseFd();

  // Whether Start was called with a descriptor it kept.
  bool started() const {
    absl::MutexLock lock(&mu_);
    return fd_ >= 0;
  }

  // Bytes read from / posted to the channel so far (frames and payloads).
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }

  // A command whose reply the channel waits for, set by the handler before
  // it dispatches it. False when kMaxSyncWaiting commands wait already (the
  // handler refuses this one).
  bool Expect(uint64_t seq);
  // Every reply of the session passes here: true when `completion` answers
  // a command waiting on the channel (it was sent there, with `payload`,
  // the reply's bytes, when given); false when it belongs on the session
  // stream (an error one is counted: errors_before).
  bool Answer(v1::Completion& completion, OwnedBytes* payload = nullptr);
  // Gives back an upload's bytes once the device has read them: on a
  // channel with raw payloads the next ones are read into them (no zero
  // fill, no fresh pages) while fewer than kMaxPooledPayloads of at least
  // kMinPooledPayloadBytes are kept; freed otherwise.
  void RecyclePayload(std::string bytes);
  // Sends `completion` on the channel without blocking, with the count of
  // error completions sent on the session stream before it. Its bytes —
  // `payload`, else its data — go raw after the frame on a channel with raw
  // payloads, in its data otherwise.
  void Write(v1::Completion completion, OwnedBytes payload = OwnedBytes());

 private:
  void Loop(Handler handle);
  // Reads `request`'s raw payload into its copy_to_device's data.
  absl::Status ReadPayload(v1::SyncRequest& request);

  static constexpr size_t kMaxPooledPayloads = 4;
  static constexpr size_t kMinPooledPayloadBytes = 1 << 20;

  const uint64_t session_id_;
  ReplyWriter* const replies_;

  mutable absl::Mutex mu_;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  // Set once, under mu_, before the thread starts; the thread and Write (for
  // a command the thread dispatched) read them without the lock.
  int fd_ = -1;
  // Atomic as well: RecyclePayload reads it for any upload, one that came
  // on the stream while the channel was starting included.
  std::atomic<bool> raw_payloads_{false};
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  absl::Mutex pool_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::string> pool_ ABSL_GUARDED_BY(pool_mu_);
  // The seqs of the commands waiting for replies here; 0 is a free slot.
  std::atomic<uint64_t> waiting_[kMaxSyncWaiting] = {};
  // Error completions sent on the session stream so far.
  std::atomic<uint64_t> errors_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> requests_{0};
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_SYNC_CHANNEL_H_
