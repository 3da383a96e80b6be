// SessionConnection's sync channel (session_connection.h): synchronous
// calls on the staging socket or a TCP session's sync port instead of the
// session stream, and a TCP session's bulk copies raw on it, pipelined.
#include "session_connection.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flagos::client {
namespace {

// How long a sync-channel call that lost its channel waits for the stream to
// end before it cancels it.
constexpr absl::Duration kSyncLossGrace = absl::Seconds(2);
// The pieces of a raw copy on the sync channel: small enough that the
// pipeline's first and last pieces, which nothing overlaps, cost little.
constexpr uint64_t kRawPieceBytes = 4ull << 20;

}  // namespace

// A copy_from_device's bytes into `out`: there already when they came raw
// after the reply's frame (read straight into it), else copied from the
// message.
absl::Status SessionConnection::TakeDownloadedBytes(const v1::Completion& completion, absl::Span<char> out,
                                                    const std::string& describe) {
  if (completion.payload_bytes() == out.size() && completion.data().empty()) return absl::OkStatus();
  if (completion.data().size() != out.size()) {
    return absl::InternalError(absl::StrCat("flagos: flagosd returned ", completion.data().size(),
                                            " bytes for a copy of ", out.size(), " bytes (",
                                            describe, ")"));
  }
  std::memcpy(out.data(), completion.data().data(), out.size());
  return absl::OkStatus();
}

absl::StatusOr<v1::Completion> SessionConnection::CallOnSyncChannel(
    v1::Command command, std::string describe, absl::Span<const char> payload,
    absl::Span<char> into) {
  absl::MutexLock sync_lock(&sync_mu_);
  absl::Status sent;
  absl::StatusOr<uint64_t> seq =
      SendOnSyncChannel(std::move(command), std::move(describe), payload, &sent);
  if (!seq.ok()) return seq.status();
  return FinishOnSyncChannel(*seq, sent, into);
}

absl::StatusOr<uint64_t> SessionConnection::SendOnSyncChannel(v1::Command command,
                                                              std::string describe,
                                                              absl::Span<const char> payload,
                                                              absl::Status* sent) {
  v1::SyncRequest request;
  bool flush;
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    absl::Status usable = UnusableLocked();
    if (!usable.ok()) return usable;
    seq = next_seq_++;
    command.set_seq(seq);
    descriptions_.Record(seq, describe);
    // The daemon runs the command after every command sent before it.
    request.set_after_seq(last_stream_seq_);
    flush = pending_.commands() > 0;
  }
  if (flush) {
    absl::MutexLock write_lock(&write_mu_);
    SendPendingLocked().IgnoreError();  // a broken stream ends the call below
  }
  *request.mutable_command() = std::move(command);
  request.set_payload_bytes(payload.size());
  *sent = sync_->Send(request, payload);
  return seq;
}

absl::StatusOr<v1::Completion> SessionConnection::FinishOnSyncChannel(uint64_t seq,
                                                                      absl::Status sent,
                                                                      absl::Span<char> into) {
  absl::StatusOr<v1::Completion> reply = sent.ok() ? sync_->Receive(into) : sent;
  absl::MutexLock lock(&mu_);
  if (!reply.ok()) {
    if (!async_error_.ok()) return TakeAsyncErrorLocked();
    // The daemon closes the sync channel only when the session ends, and
    // the stream says so soon after: wait for it (cancelling the stream if
    // it does not), so that ended() and SessionEnd() agree with this call.
    auto stream_over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !session_end_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&stream_over), kSyncLossGrace)) {
      context_.TryCancel();
      mu_.Await(absl::Condition(&stream_over));
    }
    return session_end_;
  }
  if (reply->seq() != seq) {
    return absl::InternalError(absl::StrCat("flagos: the sync channel answered command ",
                                            reply->seq(), " where command ", seq,
                                            " waited for its reply"));
  }
  // Errors of earlier commands travel on the stream: raise them here, as a
  // call on the stream would.
  const uint64_t errors_before = reply->errors_before();
  auto caught_up = [this, errors_before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return errors_received_ >= errors_before || !session_end_.ok();
  };
  mu_.Await(absl::Condition(&caught_up));
  if (!async_error_.ok()) return TakeAsyncErrorLocked();
  if (reply->code() != 0) return CompletionError(seq, *reply);
  return *std::move(reply);
}

absl::Status SessionConnection::RawCopyOnSyncChannel(int device, uint64_t stream, uint64_t addr,
                                                     char* host, uint64_t nbytes, bool upload,
                                                     const std::string& describe) {
  // Requests sent whose replies are not read yet: at most what the daemon
  // lets wait on the channel (sync_window_, 2 or 1). Uploads are answered
  // once queued; the same bound keeps their bytes in flight to two pieces.
  struct Piece {
    uint64_t seq;
    absl::Status sent;
    uint64_t done;  // where its bytes are in `host`
    uint64_t n;
  };
  absl::MutexLock sync_lock(&sync_mu_);
  std::deque<Piece> in_flight;
  absl::Status first_error;
  const auto finish_oldest = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_) {
    const Piece piece = in_flight.front();
    in_flight.pop_front();
    absl::Span<char> into;
    if (!upload) into = absl::Span<char>(host + piece.done, piece.n);
    absl::StatusOr<v1::Completion> reply = FinishOnSyncChannel(piece.seq, piece.sent, into);
    absl::Status status = reply.status();
    if (status.ok() && !upload) status = TakeDownloadedBytes(*reply, into, describe);
    if (!status.ok() && first_error.ok()) first_error = status;
  };
  for (uint64_t done = 0; done < nbytes && first_error.ok();) {
    const uint64_t n = std::min(nbytes - done, kRawPieceBytes);
    v1::Command command;
    command.set_device(device);
    command.set_stream(stream);
    absl::Span<const char> payload;
    if (upload) {
      v1::CopyToDevice* copy = command.mutable_copy_to_device();
      copy->set_addr(addr + done);
      payload = absl::Span<const char>(host + done, n);
    } else {
      v1::CopyFromDevice* copy = command.mutable_copy_from_device();
      copy->set_addr(addr + done);
      copy->set_nbytes(n);
    }
    absl::Status sent;
    absl::StatusOr<uint64_t> seq = SendOnSyncChannel(std::move(command), describe, payload, &sent);
    if (!seq.ok()) {
      first_error = seq.status();
      break;
    }
    in_flight.push_back({*seq, sent, done, n});
    done += n;
    if (!sent.ok()) break;
    if (in_flight.size() >= sync_window_) finish_oldest();
  }
  // Every request sent has its reply read: the channel stays in step.
  while (!in_flight.empty()) finish_oldest();
  return first_error;
}

}  // namespace flagos::client
