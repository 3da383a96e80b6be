#include "sync_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "flagos/v1/wire.h"

namespace flagos::client {
namespace {

// Completions carry values of synchronous ops by value; the session
// stream's message limit bounds them.
constexpr uint32_t kMaxReplyBytes = 256u << 20;

}  // namespace

SyncChannel::~SyncChannel() { close(fd_); }

void SyncChannel::Shutdown() { shutdown(fd_, SHUT_RDWR); }

absl::StatusOr<v1::Completion> SyncChannel::Call(const v1::SyncRequest& request) {
  if (!v1::WriteFrame(fd_, request)) return absl::UnavailableError("the sync channel is closed");
  std::string body;
  switch (v1::ReadFrame(fd_, kMaxReplyBytes, &body)) {
    case v1::FrameResult::kOk:
      break;
    case v1::FrameResult::kClosed:
      return absl::UnavailableError("the sync channel is closed");
    case v1::FrameResult::kTooLarge:
      return absl::InternalError(
          absl::StrCat("the sync channel carried a frame over ", kMaxReplyBytes, " bytes"));
  }
  v1::Completion completion;
  if (!completion.ParseFromString(body)) {
    return absl::InternalError("the sync channel carried a frame that is not a Completion");
  }
  return completion;
}

}  // namespace flagos::client
