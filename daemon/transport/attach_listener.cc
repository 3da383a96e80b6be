#include "transport/attach_listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include "transport/attach_frame.h"
#include "transport/listen_endpoint.h"
#include "logging.h"
#include "admission/peer_credentials.h"
#include "sessions/session.h"
#include "sessions/session_registry.h"
#include "transport/socket_acceptor.h"

namespace flagos::daemon {
absl::StatusOr<std::unique_ptr<AttachListener>> AttachListener::StartStaging(
    std::string path, const ListenEndpoint& session_socket, SessionRegistry* registry) {
  ListenEndpoint endpoint;
  endpoint.uri = absl::StrCat("unix://", path);
  endpoint.unix_path = path;
  endpoint.mode = session_socket.mode;
  endpoint.group = session_socket.group;
  endpoint.gid = session_socket.gid;
  std::unique_ptr<AttachListener> listener(
      new AttachListener(Kind::kStaging, std::move(path), registry));
  absl::StatusOr<std::unique_ptr<SocketAcceptor>> acceptor = SocketAcceptor::StartUnix(
      endpoint, "staging listener", [self = listener.get()](int fd) { self->Accepted(fd); });
  if (!acceptor.ok()) return acceptor.status();
  listener->acceptor_ = *std::move(acceptor);
  return listener;
}

absl::StatusOr<std::unique_ptr<AttachListener>> AttachListener::StartSync(
    const std::string& host, SessionRegistry* registry) {
  std::unique_ptr<AttachListener> listener(
      new AttachListener(Kind::kSync, std::string(), registry));
  absl::StatusOr<std::unique_ptr<SocketAcceptor>> acceptor = SocketAcceptor::StartTcp(
      host, "sync listener", [self = listener.get()](int fd) { self->Accepted(fd); });
  if (!acceptor.ok()) return acceptor.status();
  listener->acceptor_ = *std::move(acceptor);
  return listener;
}

AttachListener::AttachListener(Kind kind, std::string path, SessionRegistry* registry)
    : kind_(kind), path_(std::move(path)), registry_(*registry) {}

int AttachListener::port() const { return acceptor_ == nullptr ? 0 : acceptor_->port(); }

AttachListener::~AttachListener() { Stop(); }

void AttachListener::Stop() {
  if (acceptor_ == nullptr) return;
  acceptor_->Stop();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &attaching_));
}

void AttachListener::Accepted(int fd) {
  {
    absl::MutexLock lock(&mu_);
    if (attaching_ >= kMaxConcurrentAttaches) {
      LogWarning(absl::StrCat(kind_ == Kind::kSync ? "sync" : "staging", " listener: ",
                              kMaxConcurrentAttaches,
                              " attaches in progress already; closed one more"));
      close(fd);
      return;
    }
    ++attaching_;
  }
  std::thread([this, fd] {
    if (kind_ == Kind::kSync) {
      ServeSync(fd);
    } else {
      ServeStaging(fd);
    }
    absl::MutexLock lock(&mu_);
    --attaching_;
  }).detach();
}

void AttachListener::ServeStaging(int fd) {
  const absl::Time accepted = absl::Now();
  const absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);

  // Read the frame; the memfd arrives with its first bytes.
  int memfd = -1;
  absl::StatusOr<std::string> frame = ReadAttachFrame(fd, accepted, &memfd);
  absl::Status status = frame.status();
  v1::StagingAttach attach;
  if (status.ok() && !attach.ParseFromString(*frame)) {
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
  if (SendAttachReply(fd, status) && status.ok() && !pinned) {
    // The channel blocks, and may idle for as long as the session lives.
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    session->StartSyncChannel(fd);
    return;
  }
  close(fd);
}

void AttachListener::ServeSync(int fd) {
  absl::StatusOr<std::string> frame = ReadAttachFrame(fd, absl::Now(), nullptr);
  absl::Status status = frame.status();
  v1::SyncAttach attach;
  if (status.ok() && !attach.ParseFromString(*frame)) {
    status = absl::InvalidArgumentError("the attach message is not a SyncAttach");
  }
  std::shared_ptr<Session> session;
  if (status.ok()) {
    session = registry_.Find(attach.session_id());
    if (session == nullptr) {
      status = absl::NotFoundError(absl::StrCat("no live session ", attach.session_id(),
                                                " to attach a sync channel to"));
    }
  }
  if (status.ok()) status = session->AttachSyncChannel(attach);
  if (!status.ok()) LogWarning(absl::StrCat("sync-channel attach refused: ", status.message()));
  if (SendAttachReply(fd, status) && status.ok()) {
    // One small request and one small reply at a time: Nagle's algorithm
    // would hold each back for the other side's delayed ack.
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    session->StartSyncChannel(fd, attach.raw_payloads());
    return;
  }
  close(fd);
}

}  // namespace flagos::daemon
