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
#ifndef FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_
#define FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "command_descriptions.h"
#include "completion_waiters.h"
#include "flagos/client/connection.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "flagos/v1/flagos.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"

namespace flagos::client {

class SessionConnection final : public Connection {
 public:
  // `info` is the daemon's answer to Negotiate; the session is not open yet.
  SessionConnection(std::string endpoint, std::unique_ptr<v1::Flagos::Stub> stub,
                    v1::NegotiateResponse info);
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

  uint64_t Enqueue(v1::Command command, std::string describe) override;
  absl::StatusOr<v1::Completion> Call(v1::Command command, std::string describe) override;
  absl::Status Flush() override;
  absl::Status Synchronize(int device) override;
  absl::Status TakeAsyncError() override;
  absl::StatusOr<v1::GetStatsResponse> GetStats() override;
  void Close() override;
  bool closed() const override;

 private:
  // The reader thread: writes `open`, then reads until the stream ends.
  void ReadLoop(v1::ClientMessage open);
  // Handles one Completion from the daemon.
  void DeliverLocked(v1::Completion* completion) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Assigns the seq, records `describe`, appends to the pending batch.
  uint64_t AppendLocked(v1::Command command, std::string describe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BatchFullLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the pending batch, if any, as one ClientMessage.
  absl::Status SendPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Why new commands cannot be sent (OK while they can).
  absl::Status UnusableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TakeAsyncErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ClosedError() const;
  // UNAVAILABLE: the daemon ended the session; `cause` is what gRPC said.
  absl::Status SessionEndedError(absl::string_view cause) const;

  // Constant after construction.
  const std::string endpoint_;
  const std::unique_ptr<v1::Flagos::Stub> stub_;
  const v1::NegotiateResponse info_;

  // Set by OpenSession before the reader thread starts; constant afterwards.
  grpc::ClientContext context_;  // TryCancel is thread-safe
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  std::thread reader_;

  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(write_mu_);
  bool close_finished_ ABSL_GUARDED_BY(close_mu_) = false;

  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  v1::ClientMessage outgoing_ ABSL_GUARDED_BY(write_mu_);
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;   // WritesDone was called
  bool stream_ended_ ABSL_GUARDED_BY(write_mu_) = false;  // Finish was called

  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  v1::CommandBatch pending_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  CommandDescriptions descriptions_ ABSL_GUARDED_BY(mu_);
  CompletionWaiters waiters_ ABSL_GUARDED_BY(mu_);
  absl::Status async_error_ ABSL_GUARDED_BY(mu_);  // the first one not yet taken
  int later_async_errors_ ABSL_GUARDED_BY(mu_) = 0;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Close was called
  // OK while the stream lives; once the reader thread is done, why it ended
  // (what callers see) and the gRPC status it ended with.
  absl::Status session_end_ ABSL_GUARDED_BY(mu_);
  grpc::Status end_cause_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_SESSION_CONNECTION_H_
