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

absl::StatusOr<v1::Completion> SyncChannel::Call(const v1::SyncRequest& request,
                                                 absl::Span<const char> payload,
                                                 absl::Span<char> into) {
  if (absl::Status s = Send(request, payload); !s.ok()) return s;
  return Receive(into);
}

absl::Status SyncChannel::Send(const v1::SyncRequest& request, absl::Span<const char> payload) {
  const bool sent = payload.empty() ? v1::WriteFrame(fd_, request)
                                    : v1::WriteFrameAndPayload(fd_, v1::EncodeFrame(request),
                                                               payload.data(), payload.size());
  if (!sent) return absl::UnavailableError("the sync channel is closed");
  return absl::OkStatus();
}

absl::StatusOr<v1::Completion> SyncChannel::Receive(absl::Span<char> into) {
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
  if (const uint64_t n = completion.payload_bytes(); n > 0) {
    if (n > kMaxReplyBytes) {
      return absl::InternalError(
          absl::StrCat("the sync channel announced a payload over ", kMaxReplyBytes, " bytes"));
    }
    char* out = into.data();
    if (n != into.size()) {
      completion.mutable_data()->resize(n);
      out = completion.mutable_data()->data();
    }
    if (!v1::ReadBytes(fd_, out, n)) return absl::UnavailableError("the sync channel is closed");
  }
  return completion;
}

}  // namespace flagos::client
