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

void SyncChannel::Start(int fd, Handler handle) {
  absl::MutexLock lock(&mu_);
  if (detached_ || fd_ >= 0) {
    close(fd);
    return;
  }
  fd_ = fd;
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

bool SyncChannel::Answer(v1::Completion& completion) {
  uint64_t waiting = completion.seq();
  if (waiting != 0 && seq_.compare_exchange_strong(waiting, 0)) {
    Write(std::move(completion));
    return true;
  }
  if (completion.code() != 0) errors_sent_.fetch_add(1);
  return false;
}

void SyncChannel::Write(v1::Completion completion) {
  completion.set_errors_before(errors_sent_.load());
  // Without blocking; a client gone is seen by Loop.
  replies_->PostSyncFrame(fd_, v1::EncodeFrame(completion));
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
    v1::SyncRequest request;
    if (!request.ParseFromString(body)) {
      LogWarning(absl::StrCat("session ", session_id_,
                              ": a sync-channel frame is not a SyncRequest; closing the channel"));
      shutdown(fd_, SHUT_RDWR);
      return;
    }
    if (!handle(request)) return;
  }
}

}  // namespace flagos::daemon
