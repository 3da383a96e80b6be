#include "admission/peer_credentials.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace flagos::daemon {

std::string PeerCredentials::ToString() const {
  return absl::StrCat("pid ", pid, ", uid ", uid, ", gid ", gid);
}

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || length != sizeof(peer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read the peer credentials of descriptor ", fd, ": ", std::strerror(errno)));
  }
  PeerCredentials credentials;
  credentials.pid = peer.pid;
  credentials.uid = peer.uid;
  credentials.gid = peer.gid;
#ifdef SO_PEERGROUPS
  // Asked for with room for a typical count first, then with the size the
  // kernel says it needs.
  std::vector<gid_t> groups(32);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      credentials.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
#endif
  return credentials;
}

std::optional<int> AcceptedDescriptor(absl::string_view grpc_peer) {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd) || fd < 0) {
    return std::nullopt;
  }
  return fd;
}

}  // namespace flagos::daemon
