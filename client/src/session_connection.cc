#include "session_connection.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "status_codes.h"
#include "unary_calls.h"

namespace flagos::client {
namespace {

// How long Close waits for the daemon to end the session before cancelling.
constexpr absl::Duration kCloseGrace = absl::Seconds(2);
constexpr absl::Duration kStatsTimeout = absl::Seconds(5);

// Whether the daemon answers `command` even when it succeeds (flagos.proto,
// Completion).
bool OwesReply(const v1::Command& command) {
  switch (command.kind_case()) {
    case v1::Command::kAllocate:
    case v1::Command::kCopyFromDevice:
    case v1::Command::kSync:
      return true;
    case v1::Command::kOp:
      return command.op().want_values();
    default:
      return false;
  }
}

v1::Command SyncMarker(int device) {
  v1::Command command;
  command.set_device(device);
  command.mutable_sync();
  return command;
}

}  // namespace

SessionConnection::SessionConnection(std::string endpoint, std::unique_ptr<v1::Flagos::Stub> stub,
                                     v1::NegotiateResponse info)
    : endpoint_(std::move(endpoint)), stub_(std::move(stub)), info_(std::move(info)) {}

SessionConnection::~SessionConnection() { Close(); }

absl::Status SessionConnection::OpenSession(const std::string& client_name, absl::Time deadline) {
  // Corked: creating the stream sends nothing and cannot block; the initial
  // metadata leaves with `open`, written by the reader thread, so that a
  // cancel at the deadline unblocks every step of the handshake.
  context_.set_initial_metadata_corked(true);
  stream_ = stub_->Session(&context_);
  v1::ClientMessage open;
  v1::SessionOpen* request = open.mutable_open();
  request->set_version(info_.version());
  request->set_pid(getpid());
  request->set_client(client_name);
  reader_ = std::thread(&SessionConnection::ReadLoop, this, std::move(open));

  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return opened_ || !session_end_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    context_.TryCancel();
    return absl::UnavailableError(absl::StrCat(
        "flagosd at ", endpoint_,
        " answered Negotiate but did not open the session in time: it may be overloaded or hung; "
        "check its log or restart it"));
  }
  if (opened_) return absl::OkStatus();
  // The stream ended before `opened`: the daemon refused the session.
  const absl::StatusCode code = end_cause_.ok() ? absl::StatusCode::kUnavailable
                                                : AbslCode(end_cause_.error_code());
  return absl::Status(code, absl::StrCat("flagosd at ", endpoint_, " refused the session (",
                                         DescribeGrpcStatus(end_cause_), ")"));
}

uint64_t SessionConnection::session_id() const {
  absl::MutexLock lock(&mu_);
  return session_id_;
}

void SessionConnection::ReadLoop(v1::ClientMessage open) {
  bool open_sent;
  {
    absl::MutexLock write_lock(&write_mu_);
    open_sent = stream_->Write(open);
  }
  if (open_sent) {
    v1::ServerMessage message;
    while (stream_->Read(&message)) {
      absl::MutexLock lock(&mu_);
      if (message.has_opened() && !opened_) {
        opened_ = true;
        session_id_ = message.opened().session_id();
      }
      for (v1::Completion& completion : *message.mutable_completions()) {
        DeliverLocked(&completion);
      }
    }
  }
  // Reads are over, so the call is over: Finish returns at once. Writers
  // check stream_ended_ and never write after it.
  grpc::Status status;
  {
    absl::MutexLock write_lock(&write_mu_);
    stream_ended_ = true;
    status = stream_->Finish();
  }
  absl::MutexLock lock(&mu_);
  end_cause_ = status;
  session_end_ = closing_ ? ClosedError() : SessionEndedError(DescribeGrpcStatus(status));
}

void SessionConnection::DeliverLocked(v1::Completion* completion) {
  if (waiters_.Deliver(completion)) return;
  if (completion->code() == 0) return;  // nobody asked; nothing went wrong
  if (!async_error_.ok()) {
    ++later_async_errors_;
    return;
  }
  async_error_ = absl::Status(
      AbslCode(completion->code()),
      absl::StrCat("flagos: ", descriptions_.Describe(completion->seq()),
                   " failed asynchronously: ",
                   completion->message().empty() ? CodeName(completion->code())
                                                 : completion->message()));
}

uint64_t SessionConnection::AppendLocked(v1::Command command, std::string describe) {
  const uint64_t seq = next_seq_++;
  command.set_seq(seq);
  if (command.kind_case() == v1::Command::kCopyToDevice) {
    pending_bytes_ += command.copy_to_device().data().size();
  }
  descriptions_.Record(seq, std::move(describe));
  pending_.mutable_commands()->Add(std::move(command));
  return seq;
}

bool SessionConnection::BatchFullLocked() const {
  return pending_.commands_size() >= kMaxBatchCommands || pending_bytes_ >= kMaxBatchBytes;
}

absl::Status SessionConnection::SendPendingLocked() {
  {
    absl::MutexLock lock(&mu_);
    if (!session_end_.ok() || pending_.commands_size() == 0) return session_end_;
    outgoing_.mutable_batch()->Swap(&pending_);
    pending_bytes_ = 0;
  }
  // Between Finish (reader thread) and session_end_ being set.
  const bool sendable = !stream_ended_ && !writes_done_;
  const bool written = sendable && stream_->Write(outgoing_);
  // Cleared elements stay allocated and are reused by the next batch.
  outgoing_.mutable_batch()->mutable_commands()->Clear();
  if (!written) return SessionEndedError("the stream broke while sending a batch");
  return absl::OkStatus();
}

uint64_t SessionConnection::Enqueue(v1::Command command, std::string describe) {
  uint64_t seq;
  bool full;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || !session_end_.ok()) return 0;
    seq = AppendLocked(std::move(command), std::move(describe));
    full = BatchFullLocked();
  }
  if (full) {
    absl::MutexLock write_lock(&write_mu_);
    // A broken stream is reported by the next synchronous call.
    SendPendingLocked().IgnoreError();
  }
  return seq;
}

absl::StatusOr<v1::Completion> SessionConnection::Call(v1::Command command,
                                                       std::string describe) {
  CompletionWaiters::Slot slot;
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    absl::Status usable = UnusableLocked();
    if (!usable.ok()) return usable;
    if (!OwesReply(command)) {
      std::string marker_describe = absl::StrCat("synchronize after ", describe);
      AppendLocked(std::move(command), std::move(describe));
      command = SyncMarker(-1);
      describe = std::move(marker_describe);
    }
    // Registered before the batch leaves, so the answer cannot be missed.
    seq = AppendLocked(std::move(command), std::move(describe));
    waiters_.Register(seq, &slot);
  }
  {
    absl::MutexLock write_lock(&write_mu_);
    // A failed write ends the stream, which ends the wait below.
    SendPendingLocked().IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  auto answered = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slot.done || !session_end_.ok();
  };
  mu_.Await(absl::Condition(&answered));
  if (!slot.done) {
    waiters_.Unregister(seq);
    if (!async_error_.ok()) return TakeAsyncErrorLocked();
    return session_end_;
  }
  if (!async_error_.ok()) return TakeAsyncErrorLocked();
  if (slot.completion.code() != 0) {
    return absl::Status(
        AbslCode(slot.completion.code()),
        absl::StrCat("flagos: ", descriptions_.Describe(seq), " failed: ",
                     slot.completion.message().empty() ? CodeName(slot.completion.code())
                                                       : slot.completion.message()));
  }
  return std::move(slot.completion);
}

absl::Status SessionConnection::Flush() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return ClosedError();
  }
  absl::MutexLock write_lock(&write_mu_);
  return SendPendingLocked();
}

absl::Status SessionConnection::Synchronize(int device) {
  std::string describe =
      device < 0 ? std::string("synchronize") : absl::StrCat("synchronize device ", device);
  return Call(SyncMarker(device), std::move(describe)).status();
}

absl::Status SessionConnection::TakeAsyncError() {
  absl::MutexLock lock(&mu_);
  return TakeAsyncErrorLocked();
}

absl::Status SessionConnection::TakeAsyncErrorLocked() {
  absl::Status error = std::exchange(async_error_, absl::OkStatus());
  const int later = std::exchange(later_async_errors_, 0);
  if (later > 0) {
    error = absl::Status(error.code(),
                         absl::StrCat(error.message(), " (and ", later, " later asynchronous error",
                                      later == 1 ? "" : "s", ")"));
  }
  return error;
}

absl::StatusOr<v1::GetStatsResponse> SessionConnection::GetStats() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return ClosedError();
  }
  return FetchStats(*stub_, endpoint_, absl::Now() + kStatsTimeout);
}

void SessionConnection::Close() {
  absl::MutexLock close_lock(&close_mu_);
  if (close_finished_) return;
  close_finished_ = true;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (stream_ == nullptr) return;  // the session was never opened

  // Bounds every step below, including a write stuck behind a daemon that
  // stopped reading: if the stream has not ended in time, cancel it.
  std::thread watchdog([this] {
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      auto stream_over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !session_end_.ok();
      };
      ended = mu_.AwaitWithTimeout(absl::Condition(&stream_over), kCloseGrace);
    }
    if (!ended) context_.TryCancel();
  });
  {
    absl::MutexLock write_lock(&write_mu_);
    // Commands enqueued before Close still go out.
    SendPendingLocked().IgnoreError();
    if (!stream_ended_ && !writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  watchdog.join();
  reader_.join();
}

bool SessionConnection::closed() const {
  absl::MutexLock lock(&mu_);
  return closing_;
}

absl::Status SessionConnection::UnusableLocked() const {
  if (closing_) return ClosedError();
  return session_end_;
}

absl::Status SessionConnection::ClosedError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("flagos: the connection to flagosd at ", endpoint_,
                   " is closed (Connection::Close was called): open a new connection"));
}

absl::Status SessionConnection::SessionEndedError(absl::string_view cause) const {
  return absl::UnavailableError(absl::StrCat(
      "flagosd at ", endpoint_, " ended the session (", cause,
      "): the daemon stopped or crashed; tensors on flagos are lost — restart the daemon and the "
      "program"));
}

}  // namespace flagos::client
