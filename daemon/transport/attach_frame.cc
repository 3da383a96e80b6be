#include "transport/attach_frame.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "flagos/v1/flagos.pb.h"
#include "flagos/v1/wire.h"
#include "transport/sync_channel.h"

namespace flagos::daemon {

absl::StatusOr<std::string> ReadAttachFrame(int fd, absl::Time accepted, int* received_fd) {
  const absl::Time deadline = accepted + absl::Seconds(kAttachDeadlineSeconds);
  if (received_fd != nullptr) *received_fd = -1;
  std::string frame;
  while (true) {
    // The deadline is for the whole frame, however its bytes arrive.
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd ready{fd, POLLIN, 0};
    const int polled = left_ms > 0 ? poll(&ready, 1, static_cast<int>(left_ms)) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the attach did not complete within ", kAttachDeadlineSeconds, " s"));
    }
    char buffer[kMaxAttachBytes + 4];
    iovec iov{buffer, sizeof(buffer)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (received_fd != nullptr && *received_fd < 0) {
          *received_fd = received;
        } else {
          close(received);  // at most one descriptor is expected
        }
      }
    }
    if (n <= 0) return absl::InvalidArgumentError("the attach message ended early");
    frame.append(buffer, static_cast<size_t>(n));
    if (frame.size() < 4) continue;
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) {
      length |= static_cast<uint32_t>(static_cast<uint8_t>(frame[i])) << (8 * i);
    }
    if (length > kMaxAttachBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the attach message claims ", length, " bytes; the limit is ", kMaxAttachBytes));
    }
    if (frame.size() >= 4 + length) return frame.substr(4, length);
  }
}

bool SendAttachReply(int fd, const absl::Status& status) {
  v1::StagingAttached reply;
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  if (status.ok()) reply.set_max_sync_waiting(kMaxSyncWaiting);
  return v1::WriteFrame(fd, reply);
}

}  // namespace flagos::daemon
