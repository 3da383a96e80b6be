// The replies of one session, written by a thread of the session's own so
// that no queue worker ever blocks on a client's socket (issue 10): a
// client that stops reading could otherwise hold every worker of a device.
//
// Two paths, each kept in the order its replies were posted:
//   - the session stream: PostCompletion queues a Completion in an outbox;
//     the writer thread drains it, batching the completions waiting into
//     one ServerMessage (up to kMaxReplyBatchBytes), through `write` (the
//     gRPC stream's blocking Write);
//   - the sync channel: PostSyncFrame sends the frame at once without
//     blocking (MSG_DONTWAIT), the latency-critical path of `.item()`; only
//     the bytes the socket does not take now go to the writer thread, which
//     sends them blocking (after the sync bytes queued before them).
//
// The bytes posted and not yet written (both paths, the batch being written
// included) are bounded by kMaxUnreadReplyBytes. A post that would exceed it
// drops everything pending, calls `end` once with RESOURCE_EXHAUSTED (the
// session must end: the service cancels the stream with that status) and
// returns without blocking; later posts are dropped.
//
// Thread safety: posts from any thread. Finish and Stop from the thread
// that ends the session, once (the destructor stops).
#ifndef FLAGOS_DAEMON_TRANSPORT_REPLY_WRITER_H_
#define FLAGOS_DAEMON_TRANSPORT_REPLY_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "flagos/v1/flagos.pb.h"
#include "transport/owned_bytes.h"

namespace flagos::daemon {

// Replies of one session posted and not yet written, on the stream and the
// sync channel together. copy_from_device replies over TCP carry their
// bytes inline, up to 128 MiB each: two of them fit.
inline constexpr uint64_t kMaxUnreadReplyBytes = 256ull << 20;
// The writer batches waiting completions into one ServerMessage up to this
// many bytes (one larger completion goes alone).
inline constexpr uint64_t kMaxReplyBatchBytes = 16ull << 20;

class ReplyWriter {
 public:
  // Writes one message on the session stream, blocking; false when the
  // stream is gone (cancelled, client died): the writer drops what is
  // pending there and writes nothing more on it.
  using WriteFn = std::function<bool(const v1::ServerMessage&)>;
  // Ends the session with `status` without blocking (cancels its stream).
  using EndFn = std::function<void(const absl::Status&)>;

  // Starts the writer thread. `session_id` names the session in messages.
  ReplyWriter(uint64_t session_id, WriteFn write, EndFn end,
              uint64_t max_unread_bytes = kMaxUnreadReplyBytes);
  // Stop().
  ~ReplyWriter();

  ReplyWriter(const ReplyWriter&) = delete;
  ReplyWriter& operator=(const ReplyWriter&) = delete;

  // Queues `completion` for the session stream. Never blocks.
  void PostCompletion(v1::Completion completion);
  // Sends `frame` (EncodeFrame's bytes), then `payload` (raw bytes that
  // follow it; may be empty), on the sync channel socket `fd`: as much as
  // the socket takes now, the rest by the writer thread (moved, not
  // copied). Never blocks. `fd` stays open until Stop returned
  // (Session::Close's rule); one fd per writer. A send that fails (peer
  // gone, socket shut down) drops the frame: the sync channel's reader sees
  // the peer gone.
  void PostSyncFrame(int fd, std::string frame, OwnedBytes payload = OwnedBytes());

  // Waits until everything posted has been written (or dropped: stream
  // gone, bound exceeded), then stops the thread. For a session that ends
  // normally: its last replies still go out. It waits while the client
  // does not read, until the stream is cancelled (client gone, deadline,
  // daemon shutdown).
  void Finish();
  // Drops what is pending and joins the thread; a write in progress
  // finishes first (a sync send fails once its socket is shut down; a
  // stream write once the stream is cancelled). Nothing is written after.
  // Idempotent.
  void Stop();

  // Bytes posted and not yet written.
  uint64_t unread_bytes() const;

  // The RESOURCE_EXHAUSTED status a session ends with when its unread
  // replies exceed `bound` bytes.
  static absl::Status UnreadRepliesExceeded(uint64_t session_id, uint64_t bound);

 private:
  void Run();
  // Drops the pending replies of both paths; REQUIRES mu_.
  void DropPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accounts `bytes` more; false (and the session ended) when that
  // exceeds the bound.
  bool ReserveLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const uint64_t session_id_;
  const WriteFn write_;
  const EndFn end_;
  const uint64_t max_unread_bytes_;

  // A leaf: posts take it under any of the session's locks, so `end_` and
  // `write_` are called only after it is released.
  mutable absl::Mutex mu_;
  std::deque<v1::Completion> outbox_ ABSL_GUARDED_BY(mu_);
  // Sync-channel bytes the socket did not take yet, in order: pieces (a
  // frame, a payload), each from its `sent` on; sync_pending_bytes_ in all.
  struct Piece {
    OwnedBytes bytes;
    size_t sent = 0;
  };
  std::deque<Piece> sync_pending_ ABSL_GUARDED_BY(mu_);
  uint64_t sync_pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_fd_ ABSL_GUARDED_BY(mu_) = -1;
  // The writer thread is sending sync bytes it took out of sync_pending_:
  // a new frame queues behind them instead of taking the fast path.
  bool sync_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t unread_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool sync_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool exceeded_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started when everything above exists
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_REPLY_WRITER_H_
