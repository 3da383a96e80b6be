#include "transport/sync_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "flagos/v1/wire.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

// A sync-channel request is one command; its arguments may carry host
// tensors by value, within the session stream's own message limit.
constexpr uint32_t kMaxSyncFrameBytes = 256u << 20;

}  // namespace

void SyncChannel::Start(int fd, Handler handle, bool raw_payloads) {
  absl::MutexLock lock(&mu_);
  if (detached_ || fd_ >= 0) {
    close(fd);
    return;
  }
  fd_ = fd;
  raw_payloads_.store(raw_payloads, std::memory_order_relaxed);
  thread_ = std::thread(&SyncChannel::Loop, this, std::move(handle));
}

void SyncChannel::Detach() {
  absl::MutexLock lock(&mu_);
  detached_ = true;
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void SyncChannel::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    thread.swap(thread_);
  }
  if (thread.joinable()) thread.join();
}

void SyncChannel::CloseFd() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

bool SyncChannel::Expect(uint64_t seq) {
  for (std::atomic<uint64_t>& slot : waiting_) {
    uint64_t free = 0;
    if (slot.compare_exchange_strong(free, seq)) return true;
  }
  return false;
}

bool SyncChannel::Answer(v1::Completion& completion, OwnedBytes* payload) {
  const uint64_t seq = completion.seq();
  if (seq != 0) {
    for (std::atomic<uint64_t>& slot : waiting_) {
      uint64_t waiting = seq;
      if (slot.load(std::memory_order_relaxed) == seq && slot.compare_exchange_strong(waiting, 0)) {
        Write(std::move(completion), payload != nullptr ? std::move(*payload) : OwnedBytes());
        return true;
      }
    }
  }
  if (completion.code() != 0) errors_sent_.fetch_add(1);
  return false;
}

void SyncChannel::Write(v1::Completion completion, OwnedBytes payload) {
  completion.set_errors_before(errors_sent_.load());
  if (raw_payloads_.load(std::memory_order_relaxed)) {
    // The bytes go raw after the frame: neither end copies them through
    // the message.
    if (payload.empty() && !completion.data().empty()) {
      payload = OwnedBytes(std::move(*completion.mutable_data()));
      completion.clear_data();
    }
    if (!payload.empty()) completion.set_payload_bytes(payload.size());
  } else if (!payload.empty()) {
    completion.set_data(payload.TakeString());
  }
  std::string frame = v1::EncodeFrame(completion);
  bytes_sent_.fetch_add(frame.size() + payload.size(), std::memory_order_relaxed);
  // Without blocking; a client gone is seen by Loop.
  replies_->PostSyncFrame(fd_, std::move(frame), std::move(payload));
}

void SyncChannel::RecyclePayload(std::string bytes) {
  // Only raw uploads are read into pooled buffers: a session whose uploads
  // come inline on its stream keeps none.
  if (!raw_payloads_.load(std::memory_order_relaxed) || bytes.size() < kMinPooledPayloadBytes) {
    return;
  }
  absl::MutexLock lock(&pool_mu_);
  if (pool_.size() < kMaxPooledPayloads) pool_.push_back(std::move(bytes));
}

absl::Status SyncChannel::ReadPayload(v1::SyncRequest& request) {
  const uint64_t n = request.payload_bytes();
  const v1::Command& command = request.command();
  if (command.kind_case() != v1::Command::kCopyToDevice ||
      !command.copy_to_device().data().empty() || command.copy_to_device().has_staged() ||
      command.copy_to_device().has_pinned()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sync-channel request with a raw payload carries command ", command.seq(),
        ", which is not a copy_to_device of inline bytes"));
  }
  if (n > kMaxSyncFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a sync-channel payload of ", n,
                                                   " bytes exceeds ", kMaxSyncFrameBytes));
  }
  std::string* data = request.mutable_command()->mutable_copy_to_device()->mutable_data();
  {
    absl::MutexLock lock(&pool_mu_);
    if (!pool_.empty()) {
      data->swap(pool_.back());
      pool_.pop_back();
    }
  }
  data->resize(n);  // fills only what a pooled buffer lacks
  if (!v1::ReadBytes(fd_, data->data(), n)) {
    return absl::UnavailableError("the sync channel closed inside a payload");
  }
  bytes_received_.fetch_add(n, std::memory_order_relaxed);
  return absl::OkStatus();
}

void SyncChannel::Loop(Handler handle) {
  while (true) {
    std::string body;
    if (const v1::FrameResult r = v1::ReadFrame(fd_, kMaxSyncFrameBytes, &body);
        r != v1::FrameResult::kOk) {
      // Closed by the client or by Stop(); an oversized frame is worth a line.
      if (r == v1::FrameResult::kTooLarge) {
        LogWarning(absl::StrCat("session ", session_id_, ": a sync-channel frame exceeds ",
                                kMaxSyncFrameBytes, " bytes; closing the channel"));
      }
      shutdown(fd_, SHUT_RDWR);  // the client's waiting call fails, never hangs
      return;
    }
    bytes_received_.fetch_add(4 + body.size(), std::memory_order_relaxed);
    requests_.fetch_add(1, std::memory_order_relaxed);
    v1::SyncRequest request;
    if (!request.ParseFromString(body)) {
      LogWarning(absl::StrCat("session ", session_id_,
                              ": a sync-channel frame is not a SyncRequest; closing the channel"));
      shutdown(fd_, SHUT_RDWR);
      return;
    }
    if (request.payload_bytes() > 0) {
      if (absl::Status s = ReadPayload(request); !s.ok()) {
        LogWarning(absl::StrCat("session ", session_id_, ": ", s.message(),
                                "; closing the sync channel"));
        shutdown(fd_, SHUT_RDWR);
        return;
      }
    }
    if (!handle(request)) return;
  }
}

}  // namespace flagos::daemon
