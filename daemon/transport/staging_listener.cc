#include "transport/staging_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "flagos/v1/flagos.pb.h"
#include "transport/listen_endpoint.h"
#include "logging.h"
#include "admission/peer_credentials.h"
#include "sessions/session.h"
#include "sessions/session_registry.h"
#include "transport/unix_acceptor.h"
#include "flagos/v1/wire.h"

namespace flagos::daemon {
namespace {

// An attach message is a few dozen bytes; anything larger is not a client.
constexpr uint32_t kMaxAttachBytes = 4096;

bool SendReply(int fd, const absl::Status& status) {
  v1::StagingAttached reply;
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  return v1::WriteFrame(fd, reply);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingListener>> StagingListener::Start(
    std::string path, const ListenEndpoint& session_socket, SessionRegistry* registry) {
  ListenEndpoint endpoint;
  endpoint.uri = absl::StrCat("unix://", path);
  endpoint.unix_path = path;
  endpoint.mode = session_socket.mode;
  endpoint.group = session_socket.group;
  endpoint.gid = session_socket.gid;
  std::unique_ptr<StagingListener> listener(new StagingListener(std::move(path), registry));
  absl::StatusOr<std::unique_ptr<UnixAcceptor>> acceptor = UnixAcceptor::Start(
      endpoint, "staging listener", [self = listener.get()](int fd) { self->Accepted(fd); });
  if (!acceptor.ok()) return acceptor.status();
  listener->acceptor_ = *std::move(acceptor);
  return listener;
}

StagingListener::StagingListener(std::string path, SessionRegistry* registry)
    : path_(std::move(path)), registry_(*registry) {}

StagingListener::~StagingListener() { Stop(); }

void StagingListener::Stop() {
  if (acceptor_ == nullptr) return;
  acceptor_->Stop();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &attaching_));
}

void StagingListener::Accepted(int fd) {
  {
    absl::MutexLock lock(&mu_);
    if (attaching_ >= kMaxConcurrentAttaches) {
      LogWarning(absl::StrCat("staging listener: ", kMaxConcurrentAttaches,
                              " attaches in progress already; closed one more"));
      close(fd);
      return;
    }
    ++attaching_;
  }
  std::thread([this, fd] {
    Serve(fd);
    absl::MutexLock lock(&mu_);
    --attaching_;
  }).detach();
}

void StagingListener::Serve(int fd) {
  const absl::Time deadline = absl::Now() + absl::Seconds(kAttachDeadlineSeconds);
  // The reply is a few bytes into an empty socket buffer: it cannot block.
  const absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);

  // Read the frame; the memfd arrives with its first bytes.
  std::string frame;
  int memfd = -1;
  absl::Status status;
  while (true) {
    // The deadline is for the whole attach, however the bytes arrive.
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd ready{fd, POLLIN, 0};
    const int polled = left_ms > 0 ? poll(&ready, 1, static_cast<int>(left_ms)) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "the attach did not complete within ", kAttachDeadlineSeconds, " s"));
      break;
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
        if (memfd < 0) {
          memfd = received;
        } else {
          close(received);  // only one descriptor is expected
        }
      }
    }
    if (n <= 0) {
      status = absl::InvalidArgumentError("the attach message ended early");
      break;
    }
    frame.append(buffer, static_cast<size_t>(n));
    if (frame.size() < 4) continue;
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(frame[i])) << (8 * i);
    if (length > kMaxAttachBytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat("the attach message claims ", length, " bytes; the limit is ",
                       kMaxAttachBytes));
      break;
    }
    if (frame.size() >= 4 + length) {
      frame.resize(4 + length);
      break;
    }
  }
  v1::StagingAttach attach;
  if (status.ok() && !attach.ParseFromArray(frame.data() + 4, static_cast<int>(frame.size() - 4))) {
    status = absl::InvalidArgumentError("the attach message is not a StagingAttach");
  }
  if (status.ok() && memfd < 0) {
    status = absl::InvalidArgumentError(
        "the attach message carried no file descriptor (send the memfd as SCM_RIGHTS)");
  }
  std::shared_ptr<Session> session;
  if (status.ok()) {
    session = registry_.Find(attach.session_id());
    if (session == nullptr) {
      status = absl::NotFoundError(
          absl::StrCat("no live session ", attach.session_id(), " to attach a staging region to"));
    }
  }
  const bool pinned = attach.has_pinned();
  if (status.ok() && pinned) {
    status = session->AttachPinned(attach, std::exchange(memfd, -1));
  } else if (status.ok()) {
    status = session->AttachStaging(attach, std::exchange(memfd, -1),
                                    peer.ok() ? peer->uid : -1);
  }
  if (memfd >= 0) close(memfd);
  if (!status.ok()) {
    LogWarning(absl::StrCat("staging attach refused (",
                            peer.ok() ? peer->ToString() : "peer unknown", "): ",
                            status.message()));
  }
  // A staging region attached: the connection stays open as the session's
  // sync channel. A pinned region's attach ends with the answer.
  if (SendReply(fd, status) && status.ok() && !pinned) {
    // The channel blocks, and may idle for as long as the session lives.
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    session->StartSyncChannel(fd);
    return;
  }
  close(fd);
}

}  // namespace flagos::daemon
