#include "unix_frames.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

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

bool WriteFrame(int fd, const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  std::string frame(4 + size, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  if (!message.SerializeToArray(frame.data() + 4, static_cast<int>(size))) return false;
  const char* data = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    const ssize_t sent = send(fd, data, left, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data += sent;
    left -= static_cast<size_t>(sent);
  }
  return true;
}

absl::Status ReadFrame(int fd, uint32_t max_bytes, std::string* body) {
  unsigned char header[4];
  if (!ReadExactly(fd, reinterpret_cast<char*>(header), 4)) {
    return absl::UnavailableError("the peer closed the socket");
  }
  const uint32_t length = static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
                          static_cast<uint32_t>(header[2]) << 16 |
                          static_cast<uint32_t>(header[3]) << 24;
  if (length > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", length, " bytes; the limit is ", max_bytes));
  }
  body->resize(length);
  if (!ReadExactly(fd, body->data(), length)) {
    return absl::UnavailableError("the peer closed the socket mid-frame");
  }
  return absl::OkStatus();
}

}  // namespace flagos::daemon
