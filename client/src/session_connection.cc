#include "session_connection.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "flagos/v1/wire.h"
#include "attach_socket.h"
#include "endpoint.h"
#include "status_codes.h"
#include "unary_calls.h"

namespace flagos::client {
namespace {

// How long Close waits for the daemon to end the session before cancelling.
constexpr absl::Duration kCloseGrace = absl::Seconds(2);
constexpr absl::Duration kStatsTimeout = absl::Seconds(5);
// Empty idle-flush periods before the flusher sleeps until woken.
constexpr int kIdleFlushTicks = 20;

void LogOnce(const std::string& message) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) fprintf(stderr, "%s\n", message.c_str());
}

// This process's command line, arguments joined by spaces (for operators:
// flagos-smi shows it); empty when /proc cannot tell. Bounded: the daemon
// keeps 4 KiB of it.
std::string OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string line;
  char c;
  // Arguments are NUL-separated; control characters (a newline inside a
  // `python -c` program) become spaces too, so the line stays one line.
  while (line.size() < 8192 && in.get(c)) {
    line.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

v1::Command SyncMarker(int device) {
  v1::Command command;
  command.set_device(device);
  command.mutable_sync();
  return command;
}

}  // namespace

SessionConnection::SessionConnection(std::string endpoint, std::shared_ptr<grpc::Channel> channel,
                                     v1::NegotiateResponse info, ConnectionOptions options)
    : endpoint_(std::move(endpoint)),
      channel_(std::move(channel)),
      stub_(v1::Flagos::NewStub(channel_)),
      info_(std::move(info)),
      options_(options) {}

SessionConnection::~SessionConnection() { Close(); }

absl::Status SessionConnection::OpenSession(const std::string& client_name, absl::Time deadline) {
  // Corked: creating the stream sends nothing and cannot block; the initial
  // metadata leaves with `open`, written by the reader thread, so that a
  // cancel at the deadline unblocks every step of the handshake.
  context_.set_initial_metadata_corked(true);
  // The Session method as the generated stub calls it, but writing
  // serialized ClientMessages: batches are encoded as their commands are
  // enqueued (EncodedBatch).
  static const std::string* const kSessionMethod =
      new std::string(absl::StrCat("/", v1::Flagos::service_full_name(), "/Session"));
  const grpc::internal::RpcMethod session_method(
      kSessionMethod->c_str(), grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
  stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::ServerMessage>::
                    Create(channel_.get(), session_method, &context_));
  v1::ClientMessage open;
  v1::SessionOpen* request = open.mutable_open();
  request->set_version(info_.version());
  request->set_pid(getpid());
  request->set_client(client_name);
  request->set_torch_version(options_.torch_version);
  request->set_command_line(OwnCommandLine());
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
  if (opened_) {
    const std::string socket = staging_socket_;
    const std::string token = staging_token_;
    const uint32_t sync_port = sync_port_;
    mu_.Unlock();
    if (!socket.empty() && options_.staging) {
      AttachStaging(socket, token, absl::Now() + kAttachTimeout);
    } else if (socket.empty() && sync_port != 0) {
      AttachSyncOverTcp(sync_port, token, absl::Now() + kAttachTimeout);
    }
    if (options_.idle_flush != absl::InfiniteDuration()) {
      flusher_ = std::thread(&SessionConnection::FlushLoop, this);
    }
    mu_.Lock();
    return absl::OkStatus();
  }
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
    grpc::ByteBuffer bytes;
    bool own = false;
    open_sent = grpc::SerializationTraits<v1::ClientMessage>::Serialize(open, &bytes, &own).ok() &&
                stream_->Write(bytes);
  }
  if (open_sent) {
    v1::ServerMessage message;
    while (stream_->Read(&message)) {
      absl::MutexLock lock(&mu_);
      if (message.has_opened() && !opened_) {
        opened_ = true;
        session_id_ = message.opened().session_id();
        staging_socket_ = message.opened().staging_socket();
        staging_token_ = message.opened().staging_token();
        sync_port_ = message.opened().sync_port();
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
  ended_.store(true, std::memory_order_release);
}

void SessionConnection::DeliverLocked(v1::Completion* completion) {
  if (completion->code() != 0) ++errors_received_;
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

void SessionConnection::AttachStaging(const std::string& socket, const std::string& token,
                                      absl::Time deadline) {
  absl::StatusOr<std::unique_ptr<StagingRegion>> region =
      StagingRegion::Create(kStagingBytes, kStagingSlotBytes);
  absl::Status status = region.status();
  absl::StatusOr<int> channel = absl::UnknownError("not attached");
  if (status.ok()) {
    channel = (*region)->Attach(socket, session_id(), token, deadline);
    status = channel.status();
  }
  if (!status.ok()) {
    LogOnce(absl::StrCat("flagos: no shared staging region with flagosd at ", endpoint_, " (",
                         status.message(), "); tensor bytes travel inside the session stream"));
    return;
  }
  staging_ = *std::move(region);
  sync_ = std::make_unique<SyncChannel>(*channel);
}

void SessionConnection::AttachSyncOverTcp(uint32_t port, const std::string& token,
                                          absl::Time deadline) {
  v1::SyncAttach attach;
  attach.set_session_id(session_id());
  attach.set_token(token);
  attach.set_raw_payloads(true);
  const std::string host = TcpHost(endpoint_);
  uint32_t max_waiting = 1;
  absl::StatusOr<int> channel = AttachSyncChannel(host, port, attach, deadline, &max_waiting);
  if (!channel.ok()) {
    LogOnce(absl::StrCat("flagos: no sync channel with flagosd at ", endpoint_, " (",
                         channel.status().message(),
                         "); synchronous calls travel inside the session stream"));
    return;
  }
  sync_ = std::make_unique<SyncChannel>(*channel);
  sync_raw_payloads_ = true;
  // Two pieces of a bulk copy in flight where the daemon takes them (one
  // from a daemon older than pipelined copies).
  sync_window_ = std::min<uint32_t>(max_waiting, 2);
}

void SessionConnection::FlushLoop() {
  int empty_ticks = 0;
  while (true) {
    bool pending;
    uint64_t batch;
    absl::Time since;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || !session_end_.ok()) return;
      pending = pending_.commands() > 0;
      batch = batches_sent_;
      since = pending_since_;
    }
    if (!pending && ++empty_ticks > kIdleFlushTicks) {
      // Nothing for a while: sleep until Enqueue starts a batch (it wakes
      // this thread only when flusher_idle_ is set).
      flusher_idle_.store(true);
      {
        absl::MutexLock lock(&mu_);
        if (closing_ || !session_end_.ok() || pending_.commands() > 0) {
          flusher_idle_.store(false);
          continue;
        }
      }
      absl::MutexLock lock(&flush_mu_);
      flush_mu_.Await(absl::Condition(&flush_wake_));
      flush_wake_ = false;
      flusher_idle_.store(false);
      empty_ticks = 0;
      continue;
    }
    const absl::Time deadline =
        pending ? since + options_.idle_flush : absl::Now() + options_.idle_flush;
    {
      absl::MutexLock lock(&flush_mu_);
      flush_mu_.AwaitWithDeadline(absl::Condition(&flush_wake_), deadline);
      flush_wake_ = false;
    }
    if (!pending) continue;
    empty_ticks = 0;
    absl::MutexLock write_lock(&write_mu_);
    bool send;
    {
      absl::MutexLock lock(&mu_);
      send = batches_sent_ == batch && pending_.commands() > 0 && pending_since_ == since;
    }
    if (send) SendPendingLocked().IgnoreError();
  }
}

void SessionConnection::WakeFlusher() {
  absl::MutexLock lock(&flush_mu_);
  flush_wake_ = true;
}

uint64_t SessionConnection::NextSeqLocked(absl::string_view describe) {
  const uint64_t seq = next_seq_++;
  last_stream_seq_ = seq;
  if (pending_.commands() == 0) pending_since_ = absl::Now();
  descriptions_.Record(seq, describe);
  return seq;
}

uint64_t SessionConnection::AppendLocked(const v1::Command& command, absl::string_view describe) {
  const uint64_t seq = NextSeqLocked(describe);
  if (command.kind_case() == v1::Command::kCopyToDevice) {
    pending_bytes_ += command.copy_to_device().data().size();
    pending_staged_bytes_ += command.copy_to_device().staged().nbytes();
  }
  pending_.Append(command, seq);
  return seq;
}

bool SessionConnection::BatchFullLocked() const {
  return pending_.commands() >= kMaxBatchCommands || pending_bytes_ >= kMaxBatchBytes ||
         pending_staged_bytes_ >= kMaxBatchStagedBytes;
}

absl::Status SessionConnection::SendPendingLocked() {
  grpc::ByteBuffer outgoing;
  {
    absl::MutexLock lock(&mu_);
    if (!session_end_.ok() || pending_.commands() == 0) return session_end_;
    outgoing = pending_.Take();
    pending_bytes_ = 0;
    pending_staged_bytes_ = 0;
    ++batches_sent_;
  }
  // Between Finish (reader thread) and session_end_ being set.
  const bool sendable = !stream_ended_ && !writes_done_;
  const bool written = sendable && stream_->Write(outgoing);
  if (!written) return SessionEndedError("the stream broke while sending a batch");
  return absl::OkStatus();
}

uint64_t SessionConnection::Enqueue(const v1::Command& command, absl::string_view describe) {
  uint64_t seq;
  bool full;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || !session_end_.ok()) return 0;
    seq = AppendLocked(command, describe);
    full = BatchFullLocked();
  }
  AfterAppend(full);
  return seq;
}

uint64_t SessionConnection::EnqueueSerialized(absl::string_view command,
                                              absl::string_view describe) {
  uint64_t seq;
  bool full;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || !session_end_.ok()) return 0;
    seq = NextSeqLocked(describe);
    pending_.AppendSerialized(command, seq);
    full = BatchFullLocked();
  }
  AfterAppend(full);
  return seq;
}

void SessionConnection::AfterAppend(bool full) {
  if (!full && flusher_idle_.load()) WakeFlusher();
  if (full) {
    absl::MutexLock write_lock(&write_mu_);
    // A broken stream is reported by the next synchronous call.
    SendPendingLocked().IgnoreError();
  }
}

absl::StatusOr<uint64_t> SessionConnection::Submit(v1::Command command, std::string describe) {
  auto slot = std::make_unique<CompletionWaiters::Slot>();
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    absl::Status usable = UnusableLocked();
    if (!usable.ok()) return usable;
    if (!v1::OwesReply(command)) {
      std::string marker_describe = absl::StrCat("synchronize after ", describe);
      AppendLocked(command, describe);
      command = SyncMarker(-1);
      describe = std::move(marker_describe);
    }
    // Registered before the batch leaves, so the answer cannot be missed.
    seq = AppendLocked(command, describe);
    waiters_.Register(seq, slot.get());
    submitted_.emplace(seq, std::move(slot));
  }
  {
    absl::MutexLock write_lock(&write_mu_);
    // A failed write ends the stream, which ends the wait in Await.
    SendPendingLocked().IgnoreError();
  }
  return seq;
}

absl::StatusOr<v1::Completion> SessionConnection::Await(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = submitted_.find(ticket);
  if (it == submitted_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flagos: ticket ", ticket, " was not submitted or was awaited already"));
  }
  CompletionWaiters::Slot* slot = it->second.get();
  auto answered = [this, slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slot->done || !session_end_.ok();
  };
  mu_.Await(absl::Condition(&answered));
  // Other threads' Submits may have rehashed the table meanwhile.
  it = submitted_.find(ticket);
  std::unique_ptr<CompletionWaiters::Slot> owned = std::move(it->second);
  submitted_.erase(it);
  if (!owned->done) {
    waiters_.Unregister(ticket);
    if (!async_error_.ok()) return TakeAsyncErrorLocked();
    return session_end_;
  }
  if (!async_error_.ok()) return TakeAsyncErrorLocked();
  if (owned->completion.code() != 0) return CompletionError(ticket, owned->completion);
  return std::move(owned->completion);
}

absl::Status SessionConnection::CompletionError(uint64_t seq,
                                                const v1::Completion& completion) const {
  return absl::Status(AbslCode(completion.code()),
                      absl::StrCat("flagos: ", descriptions_.Describe(seq), " failed: ",
                                   completion.message().empty() ? CodeName(completion.code())
                                                                : completion.message()));
}

absl::StatusOr<v1::Completion> SessionConnection::Call(v1::Command command,
                                                       std::string describe) {
  if (sync_ != nullptr && v1::OwesReply(command)) {
    return CallOnSyncChannel(std::move(command), std::move(describe));
  }
  absl::StatusOr<uint64_t> ticket = Submit(std::move(command), std::move(describe));
  if (!ticket.ok()) return ticket.status();
  return Await(*ticket);
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
    ended_.store(true, std::memory_order_release);
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
  if (sync_ != nullptr) sync_->Shutdown();
  WakeFlusher();
  if (flusher_.joinable()) flusher_.join();
}

bool SessionConnection::closed() const {
  absl::MutexLock lock(&mu_);
  return closing_;
}

absl::Status SessionConnection::SessionEnd() const {
  absl::MutexLock lock(&mu_);
  if (!ended_.load(std::memory_order_relaxed)) return absl::OkStatus();
  return UnusableLocked();
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
      "): the daemon stopped, crashed or closed it; the session's device memory is gone — a new "
      "connection opens a new session once the daemon is back"));
}

}  // namespace flagos::client
