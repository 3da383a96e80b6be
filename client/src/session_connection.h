// SessionConnection: the Connection over one gRPC Session stream.
//
// Threads: callers enqueue and write batches; one reader thread reads
// ServerMessages and hands each Completion to the call waiting for its seq,
// or records it as the asynchronous error. Every wait ends when the stream
// ends, so a daemon that dies never leaves a caller hanging.
//
// Locks, always taken in this order: close_mu_ (one Close at a time),
// write_mu_ (stream writes, which gRPC does not allow concurrently, and the
// order of batches on the wire), mu_ (everything else; held only briefly,
// never across a gRPC call).
//
// Defined in session_connection.cc (the stream, batches, calls, Close),
// session_sync_channel.cc (synchronous calls and raw copies on the sync
// channel) and session_copies.cc (uploads, downloads, pinned regions).
#ifndef FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_
#define FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "command_descriptions.h"
#include "completion_waiters.h"
#include "encoded_batch.h"
#include "pinned_region.h"
#include "staging_region.h"
#include "sync_channel.h"
#include "flagos/client/connection.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "flagos/v1/flagos.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

namespace flagos::client {

class SessionConnection final : public Connection {
 public:
  // `info` is the daemon's answer to Negotiate over `channel`; the session
  // is not open yet.
  SessionConnection(std::string endpoint, std::shared_ptr<grpc::Channel> channel,
                    v1::NegotiateResponse info, ConnectionOptions options);
  ~SessionConnection() override;

  SessionConnection(const SessionConnection&) = delete;
  SessionConnection& operator=(const SessionConnection&) = delete;

  // Opens the session stream, starts the reader thread and waits until
  // `deadline` for the daemon's `opened`. On failure the stream is cancelled;
  // destroying the object then returns promptly. Call once, before anything
  // else.
  absl::Status OpenSession(const std::string& client_name, absl::Time deadline);

  const std::string& endpoint() const override { return endpoint_; }
  const v1::NegotiateResponse& info() const override { return info_; }
  uint64_t session_id() const override;

  uint64_t Enqueue(const v1::Command& command, absl::string_view describe) override;
  uint64_t EnqueueSerialized(absl::string_view command, absl::string_view describe) override;
  absl::StatusOr<v1::Completion> Call(v1::Command command, std::string describe) override;
  absl::StatusOr<uint64_t> Submit(v1::Command command, std::string describe) override;
  absl::StatusOr<v1::Completion> Await(uint64_t ticket) override;
  absl::Status Upload(int device, uint64_t stream, uint64_t addr, const void* src,
                      uint64_t nbytes, const std::string& describe) override;
  absl::Status Download(int device, uint64_t stream, void* dst, uint64_t addr, uint64_t nbytes,
                        const std::string& describe) override;
  bool staging() const override { return staging_ != nullptr; }
  absl::StatusOr<PinnedBlock> AllocatePinned(uint64_t nbytes) override;
  void FreePinned(const PinnedBlock& block) override;
  absl::Status UploadPinned(int device, uint64_t stream, uint64_t addr, uint64_t region,
                            uint64_t offset, uint64_t nbytes, const std::string& describe) override;
  absl::Status DownloadPinned(int device, uint64_t stream, uint64_t region, uint64_t offset,
                              uint64_t addr, uint64_t nbytes, const std::string& describe) override;
  absl::Status Flush() override;
  absl::Status Synchronize(int device) override;
  absl::Status TakeAsyncError() override;
  absl::StatusOr<v1::GetStatsResponse> GetStats() override;
  void Close() override;
  bool closed() const override;
  bool ended() const override { return ended_.load(std::memory_order_acquire); }
  absl::Status SessionEnd() const override;

 private:
  // Enqueues the pinned copy of `nbytes` in chunks of at most
  // kMaxPinnedCopyChunk, `fill` setting each chunk's copy (`done` bytes in).
  absl::Status EnqueuePinnedChunks(
      int device, uint64_t stream, uint64_t nbytes, const std::string& describe,
      absl::FunctionRef<void(v1::Command*, uint64_t done, uint64_t n)> fill);
  // The reader thread: writes `open`, then reads until the stream ends.
  void ReadLoop(v1::ClientMessage open);
  // The idle-flush thread (see kIdleFlush).
  void FlushLoop();
  // Attaches a staging region when the daemon offers one (best effort: on
  // failure bytes travel inline, and the reason is logged once).
  void AttachStaging(const std::string& socket, const std::string& token, absl::Time deadline);
  // Attaches a TCP session's sync channel to the daemon's sync port (best
  // effort, like AttachStaging: synchronous calls use the stream otherwise).
  void AttachSyncOverTcp(uint32_t port, const std::string& token, absl::Time deadline);
  // A staging chunk of `nbytes`, waiting (flushing first) while the ring is
  // full; UNAVAILABLE when the session ends meanwhile.
  absl::StatusOr<StagingRegion::Chunk> ClaimChunk(uint64_t nbytes);
  void WakeFlusher();
  // Call over the sync channel (a command that owes a reply).
  // `payload` is sent raw after the request (a copy_to_device's bytes, TCP
  // channels only); a reply's raw payload of `into`'s size lands in `into`.
  absl::StatusOr<v1::Completion> CallOnSyncChannel(v1::Command command, std::string describe,
                                                   absl::Span<const char> payload = {},
                                                   absl::Span<char> into = {});
  // CallOnSyncChannel's halves. SendOnSyncChannel assigns the command's seq
  // (returned; an error when the session takes no command) and sends it,
  // setting `*sent` to how the send went; FinishOnSyncChannel reads the
  // reply to it (or takes `sent`'s failure) and turns it into the caller's
  // answer.
  absl::StatusOr<uint64_t> SendOnSyncChannel(v1::Command command, std::string describe,
                                             absl::Span<const char> payload, absl::Status* sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  absl::StatusOr<v1::Completion> FinishOnSyncChannel(uint64_t seq, absl::Status sent,
                                                     absl::Span<char> into)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // A TCP session's bulk copy, raw on the sync channel in kRawPieceBytes
  // pieces, pipelined: the request for a piece goes out before the reply to
  // the one before it is read, so the daemon copies (device→host) or reads
  // (host→device) a piece while the socket carries the other. `upload`:
  // `host` → device; else device → `host`.
  absl::Status RawCopyOnSyncChannel(int device, uint64_t stream, uint64_t addr, char* host,
                                    uint64_t nbytes, bool upload, const std::string& describe);
  // A Completion's error as the caller sees it (naming the command).
  absl::Status CompletionError(uint64_t seq, const v1::Completion& completion) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A copy_from_device's bytes into `out`: there already when they came raw
  // after the reply's frame (read straight into it), else copied from the
  // message (session_sync_channel.cc).
  static absl::Status TakeDownloadedBytes(const v1::Completion& completion, absl::Span<char> out,
                                          const std::string& describe);
  // Handles one Completion from the daemon.
  void DeliverLocked(v1::Completion* completion) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next seq, for a command about to join the pending batch: recorded
  // as the batch's last, with `describe`.
  uint64_t NextSeqLocked(absl::string_view describe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Assigns the seq, records `describe`, appends to the pending batch.
  uint64_t AppendLocked(const v1::Command& command, absl::string_view describe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueue's tail: sends the batch if it is full, else wakes an idle flusher.
  void AfterAppend(bool full);
  bool BatchFullLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the pending batch, if any, as one ClientMessage.
  absl::Status SendPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Why new commands cannot be sent (OK while they can).
  absl::Status UnusableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TakeAsyncErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ClosedError() const;
  // UNAVAILABLE: the daemon ended the session; `cause` is what gRPC said.
  absl::Status SessionEndedError(absl::string_view cause) const;

  // How long attaching the staging region, a sync channel or a pinned
  // region may take.
  static constexpr absl::Duration kAttachTimeout = absl::Seconds(2);

  // Constant after construction.
  const std::string endpoint_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Flagos::Stub> stub_;
  const v1::NegotiateResponse info_;
  const ConnectionOptions options_;

  // Set by OpenSession before the reader thread starts; constant afterwards.
  grpc::ClientContext context_;  // TryCancel is thread-safe
  // Writes serialized ClientMessages (EncodedBatch); reads ServerMessages.
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, v1::ServerMessage>> stream_;
  std::thread reader_;
  std::thread flusher_;
  // Set by OpenSession when the daemon accepted the region; constant after.
  std::unique_ptr<StagingRegion> staging_;
  // The attach socket, kept as the sync channel; set with staging_.
  std::unique_ptr<SyncChannel> sync_;
  // sync_ is a TCP channel that carries bulk bytes raw (SyncAttach.raw_payloads).
  bool sync_raw_payloads_ = false;
  // The pieces of a raw copy in flight on sync_ at once
  // (StagingAttached.max_sync_waiting, at most 2).
  uint32_t sync_window_ = 1;
  // One sync-channel call (or pipelined copy) at a time.
  absl::Mutex sync_mu_ ABSL_ACQUIRED_BEFORE(write_mu_);

  // Pinned regions by id (ids minted here from 1).
  absl::Mutex pinned_mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<PinnedRegion>> pinned_ ABSL_GUARDED_BY(pinned_mu_);
  uint64_t next_pinned_id_ ABSL_GUARDED_BY(pinned_mu_) = 1;

  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(write_mu_);
  bool close_finished_ ABSL_GUARDED_BY(close_mu_) = false;

  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;   // WritesDone was called
  bool stream_ended_ ABSL_GUARDED_BY(write_mu_) = false;  // Finish was called

  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  EncodedBatch pending_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pending_staged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The seq of the last command appended to a batch (sync-channel commands
  // are not), and the error Completions read from the stream so far.
  uint64_t last_stream_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_received_ ABSL_GUARDED_BY(mu_) = 0;
  // Batches sent so far; the idle flusher sends a batch only if it is still
  // the one it saw start.
  uint64_t batches_sent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time pending_since_ ABSL_GUARDED_BY(mu_);
  // Tickets of Submit, by seq.
  absl::flat_hash_map<uint64_t, std::unique_ptr<CompletionWaiters::Slot>> submitted_
      ABSL_GUARDED_BY(mu_);
  // The idle flusher sleeps on flush_mu_ (never on mu_, so that enqueueing
  // stays cheap); flusher_idle_ says it waits for a first command.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool flush_wake_ ABSL_GUARDED_BY(flush_mu_) = false;
  std::atomic<bool> flusher_idle_{false};
  CommandDescriptions descriptions_ ABSL_GUARDED_BY(mu_);
  CompletionWaiters waiters_ ABSL_GUARDED_BY(mu_);
  absl::Status async_error_ ABSL_GUARDED_BY(mu_);  // the first one not yet taken
  int later_async_errors_ ABSL_GUARDED_BY(mu_) = 0;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::string staging_socket_ ABSL_GUARDED_BY(mu_);  // from SessionOpened
  std::string staging_token_ ABSL_GUARDED_BY(mu_);
  uint32_t sync_port_ ABSL_GUARDED_BY(mu_) = 0;  // SessionOpened.sync_port
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Close was called
  // OK while the stream lives; once the reader thread is done, why it ended
  // (what callers see) and the gRPC status it ended with.
  absl::Status session_end_ ABSL_GUARDED_BY(mu_);
  grpc::Status end_cause_ ABSL_GUARDED_BY(mu_);
  // Set (never cleared) once the reader thread is done or Close was called.
  std::atomic<bool> ended_{false};
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_
