#include "sync_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"

namespace flagos::client {
namespace {

// Completions carry values of synchronous ops by value; the session
// stream's message limit bounds them.
constexpr uint32_t kMaxReplyBytes = 256u << 20;

bool ReadExactly(int fd, char* out, size_t n) {
  while (n > 0) {
    const ssize_t got = recv(fd, out, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

SyncChannel::~SyncChannel() { close(fd_); }

void SyncChannel::Shutdown() { shutdown(fd_, SHUT_RDWR); }

absl::StatusOr<v1::Completion> SyncChannel::Call(const v1::SyncRequest& request) {
  const size_t size = request.ByteSizeLong();
  std::string frame(4 + size, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  request.SerializeToArray(frame.data() + 4, static_cast<int>(size));
  for (size_t sent = 0; sent < frame.size();) {
    const ssize_t n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("the sync channel is closed");
    sent += static_cast<size_t>(n);
  }
  unsigned char header[4];
  if (!ReadExactly(fd_, reinterpret_cast<char*>(header), 4)) {
    return absl::UnavailableError("the sync channel is closed");
  }
  const uint32_t length = static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
                          static_cast<uint32_t>(header[2]) << 16 |
                          static_cast<uint32_t>(header[3]) << 24;
  if (length > kMaxReplyBytes) {
    return absl::InternalError(absl::StrCat("the sync channel carried a frame of ", length,
                                            " bytes; the limit is ", kMaxReplyBytes));
  }
  std::string body(length, '\0');
  if (!ReadExactly(fd_, body.data(), length)) {
    return absl::UnavailableError("the sync channel is closed");
  }
  v1::Completion completion;
  if (!completion.ParseFromString(body)) {
    return absl::InternalError("the sync channel carried a frame that is not a Completion");
  }
  return completion;
}

}  // namespace flagos::client
