#include "flagos/v1/wire.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

namespace flagos::v1 {
namespace {

bool ReadAll(int fd, char* out, size_t n) {
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

bool OwesReply(const Command& command) {
  switch (command.kind_case()) {
    case Command::kCopyFromDevice:
      // Into a pinned region: ordered on the stream like a kernel.
      return !command.copy_from_device().has_pinned();
    case Command::kAllocate:
    case Command::kSync:
    case Command::kQueryEvent:
    case Command::kSynchronizeEvent:
    case Command::kElapsedTime:
    case Command::kQueryStream:
    case Command::kExportMemory:
    case Command::kImportMemory:
    case Command::kQueryExport:
    case Command::kDefineGraph:
      return true;
    case Command::kOp:
      return command.op().want_values();
    default:
      return false;
  }
}

std::string EncodeFrame(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  std::string frame(4 + size, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  message.SerializeToArray(frame.data() + 4, static_cast<int>(size));
  return frame;
}

bool WriteFrame(int fd, const google::protobuf::MessageLite& message) {
  const std::string frame = EncodeFrame(message);
  for (size_t sent = 0; sent < frame.size();) {
    const ssize_t n = send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

FrameResult ReadFrame(int fd, uint32_t max_bytes, std::string* body) {
  unsigned char header[4];
  if (!ReadAll(fd, reinterpret_cast<char*>(header), 4)) return FrameResult::kClosed;
  const uint32_t length = static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
                          static_cast<uint32_t>(header[2]) << 16 |
                          static_cast<uint32_t>(header[3]) << 24;
  if (length > max_bytes) return FrameResult::kTooLarge;
  body->resize(length);
  if (!ReadAll(fd, body->data(), length)) return FrameResult::kClosed;
  return FrameResult::kOk;
}

bool ReadBytes(int fd, char* out, size_t n) { return ReadAll(fd, out, n); }

bool WriteFrameAndPayload(int fd, const std::string& frame, const char* payload, size_t n) {
  iovec parts[2] = {{const_cast<char*>(frame.data()), frame.size()},
                    {const_cast<char*>(payload), n}};
  int first = 0;
  while (first < 2) {
    msghdr message{};
    message.msg_iov = parts + first;
    message.msg_iovlen = static_cast<size_t>(2 - first);
    ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    while (first < 2 && static_cast<size_t>(sent) >= parts[first].iov_len) {
      sent -= static_cast<ssize_t>(parts[first].iov_len);
      ++first;
    }
    if (first < 2) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + sent;
      parts[first].iov_len -= static_cast<size_t>(sent);
    }
  }
  return true;
}

}  // namespace flagos::v1
