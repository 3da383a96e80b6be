// Session: queueing commands on their (device, stream) queue, the fences
// that wait for queued work, stream queries and synchronisation, and the
// sync channel's requests.
#include <unistd.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "execution/completion_fences.h"
#include "flagos/v1/wire.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {
namespace {

// How long query_stream waits for a busy queue to become idle before it
// answers "not ready".
constexpr absl::Duration kQueryStreamSettle = absl::Milliseconds(1);

}  // namespace

void Session::Enqueue(v1::Command& command, const std::shared_ptr<const void>& keep,
                      bool ordered, absl::string_view op_bytes) {
  absl::StatusOr<SessionStream*> state = streams_.Get(command.device(), command.stream());
  if (!state.ok()) {
    regions_.ReleaseStagedUpload(command);
    return ReplyError(command.seq(), CommandKindName(command), state.status());
  }
  const StreamHandle backend_stream = (*state)->backend_stream;
  // Upload bytes wait in memory until their queue runs them; past the limit
  // the reading thread stops reading, which backs the client off through
  // gRPC flow control.
  const uint64_t payload =
      command.has_copy_to_device() ? command.copy_to_device().data().size() : 0;
  if (payload > 0) {
    absl::MutexLock lock(&payload_mu_);
    const auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(payload_mu_) {
      return queued_payload_bytes_ <= kMaxQueuedPayloadBytes;
    };
    // Blocks with dispatch_mu_ held, which the lock order declares: the
    // queue tasks that make room take payload_mu_ alone.
    payload_mu_.Await(absl::Condition(&has_room));
    queued_payload_bytes_ += payload;
  }
  // A copy from another device reads what that device's queues write: its
  // queue parks (holding no worker) until every earlier command there has
  // executed; the queue that finishes last resumes it.
  std::shared_ptr<ReadyGate> source_ready;
  if (command.has_copy_device_to_device() &&
      command.copy_device_to_device().src_device() != command.device()) {
    source_ready = std::make_shared<ReadyGate>();
    AfterQueuedWork(command.copy_device_to_device().src_device(),
                    [source_ready](absl::Status /*errors are the commands'*/) {
                      source_ready->MarkReady();
                    });
  }
  // The client waits for this command's reply, and its queue is idle (only
  // this thread pushes to it): run it here rather than waking a worker,
  // which saves two thread switches on every synchronous round trip. Not an
  // op that came on the session stream: its kernel may run for as long as
  // the per-op bounds allow, and the stream's reading thread must stay free
  // to see the client leave (Detach) meanwhile.
  const bool owes_reply = (command.has_copy_from_device() &&
                           !command.copy_from_device().has_pinned()) ||
                          (command.has_op() && command.op().want_values() && !ordered);
  if (owes_reply && source_ready == nullptr && payload == 0 &&
      (*state)->queue->pending() == 0) {
    Execute(command, backend_stream);
    return;
  }
  (*state)->window->Count(1);
  if (source_ready != nullptr) {
    (*state)->queue->PushGate([source_ready](StreamQueue::Resume resume) {
      source_ready->Park(std::move(resume));
    });
  }
  (*state)->queue->Push(
      [this, command = &command, keep, backend_stream, payload, op_bytes]() {
        Execute(*command, backend_stream, op_bytes);
        if (payload > 0) {
          absl::MutexLock lock(&payload_mu_);
          queued_payload_bytes_ -= payload;
        }
      });
}

void Session::AfterQueuedWork(int device, std::function<void(absl::Status)> action) {
  // Only the dispatching thread pushes to the queues (dispatch_mu_).
  flagos::daemon::AfterQueuedWork(backend_.runtime(), streams_.OnDevice(device),
                                  std::move(action));
}

void Session::QueryStream(const v1::Command& command) {
  const uint64_t seq = command.seq();
  SessionStream* state = streams_.Find(command.device(), command.stream());
  bool ready = true;  // a stream never used has no work
  if (state != nullptr) {
    StreamQueue* queue = state->queue.get();
    const StreamHandle backend_stream = state->backend_stream;
    // A task that has replied (the sync or copy the client just saw
    // complete) may still be returning: give the queue a moment to settle
    // before calling it busy, so that a query right after a synchronisation
    // says ready.
    const absl::Time settle_deadline = absl::Now() + kQueryStreamSettle;
    while (queue->pending() != 0 && absl::Now() < settle_deadline) {
      absl::SleepFor(absl::Microseconds(20));
    }
    ready = queue->pending() == 0;
    if (ready) {
      absl::StatusOr<bool> done = backend_.runtime().QueryStream(command.device(), backend_stream);
      if (!done.ok()) return ReplyError(seq, "query_stream", done.status());
      ready = *done;
    }
  }
  v1::Completion completion = Done(seq);
  completion.set_ready(ready);
  Reply(std::move(completion));
}

void Session::SyncDevice(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const int device = command.device();
  const uint64_t frees_before = pending_frees_.Latest();
  // Once the device has completed every earlier command, not merely run
  // it, and their replies are posted (AfterQueuedWork drains each stream).
  AfterQueuedWork(device, [this, seq, device, frees_before](absl::Status status) {
    ReplySyncAfterFrees(seq, device, frees_before, std::move(status));
  });
}

void Session::SyncStream(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const int device = command.device();
  // Frees and releases belong to no stream: a stream-only sync waits for
  // its device's earlier ones too.
  const uint64_t frees_before = pending_frees_.Latest();
  SessionStream* state = streams_.Find(device, command.stream());
  if (state == nullptr) return ReplySyncAfterFrees(seq, device, frees_before, absl::OkStatus());
  const StreamHandle backend_stream = state->backend_stream;
  // Drained, not only synchronised: the stream's host functions post the
  // replies of its downloads.
  auto sync = [this, seq, device, frees_before, backend_stream] {
    ReplySyncAfterFrees(seq, device, frees_before,
                        backend_.runtime().DrainStream(device, backend_stream));
  };
  if (state->queue->pending() == 0) return sync();  // idle: answer from this thread
  state->queue->Push(std::move(sync));
}

void Session::ReplySyncAfterFrees(uint64_t seq, int device, uint64_t frees_before,
                                  absl::Status status) {
  pending_frees_.WhenDone(device, frees_before, [this, seq, status = std::move(status)] {
    if (!status.ok()) return ReplyError(seq, "sync", status);
    Reply(Done(seq));
  });
}


void Session::StartSyncChannel(int fd, bool raw_payloads) {
  absl::MutexLock lock(&dispatch_mu_);
  if (sync_closing_) {
    close(fd);
    return;
  }
  sync_.Start(
      fd, [this](v1::SyncRequest& request) { return HandleSyncRequest(request); }, raw_payloads);
}

bool Session::HandleSyncRequest(v1::SyncRequest& request) {
  v1::Command& command = *request.mutable_command();
  const uint64_t seq = command.seq();
  commands_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&dispatch_mu_);
  const uint64_t after = request.after_seq();
  const auto caught_up = [this, after]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_) {
    return sync_closing_ || (after == 0 || (has_seq_ && last_seq_ >= after));
  };
  dispatch_mu_.Await(absl::Condition(&caught_up));
  if (sync_closing_) return false;
  const auto dispatch_owned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_) {
    try {
      // Queued, the command outlives the request (the channel's next read).
      auto owned = std::make_shared<v1::Command>(std::move(command));
      Dispatch(*owned, owned, /*ordered=*/false);
    } catch (const std::exception& e) {
      ReplyError(seq, "sync channel",
                 absl::InternalError(absl::StrCat("flagosd failed to handle the command: ",
                                                  e.what())));
    }
  };
  if (seq != 0 && command.kind_case() == v1::Command::kCopyToDevice &&
      !command.copy_to_device().has_staged() && !command.copy_to_device().has_pinned()) {
    // Bytes sent on the channel (a TCP client's upload): queued in order
    // and acknowledged at once; the copy's own failure is asynchronous.
    dispatch_owned();
    sync_.Write(Done(seq));
    return true;
  }
  if (seq == 0 || !v1::OwesReply(command)) {
    // Answered here, on the channel it came on: the client waits on it
    // (a reply by seq would go to the session stream).
    sync_.Write(ErrorCompletion(
        seq, CommandKindName(command),
        absl::InvalidArgumentError(absl::StrCat(
            "command ", seq, " (", CommandKindName(command),
            ") cannot use the sync channel: only a command with a nonzero seq that owes a "
            "reply can; send it on the session stream"))));
    return true;
  }
  if (!sync_.Expect(seq)) {
    sync_.Write(ErrorCompletion(
        seq, CommandKindName(command),
        absl::FailedPreconditionError(absl::StrCat(
            "command ", seq, " (", CommandKindName(command), ") is one more than the ",
            kMaxSyncWaiting,
            " commands that may wait for replies on the sync channel at once; read the replies "
            "of those sent before it first"))));
    return true;
  }
  dispatch_owned();
  return true;
}

}  // namespace flagos::daemon
