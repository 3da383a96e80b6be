// Who is at the other end of a unix socket, from the kernel (SO_PEERCRED,
// SO_PEERGROUPS): the process, user and groups that connected. A client
// cannot claim them; TCP peers have none.
#ifndef FLAGOS_DAEMON_ADMISSION_PEER_CREDENTIALS_H_
#define FLAGOS_DAEMON_ADMISSION_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

struct PeerCredentials {
  int64_t pid = -1;
  int64_t uid = -1;
  int64_t gid = -1;  // the primary group
  // The supplementary groups at connect time (SO_PEERGROUPS); empty where
  // the kernel does not say.
  std::vector<gid_t> groups;

  // "pid 4711, uid 1000, gid 1000".
  std::string ToString() const;
};

// The credentials of the process that connected unix socket `fd`, as they
// were when it connected. FAILED_PRECONDITION when `fd` is not a unix
// socket or the kernel does not say.
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd);

// The descriptor of a connection that the daemon accepted itself and handed
// to gRPC, from the call's peer string ("fd:17"); nullopt for any other peer
// (TCP: "ipv4:127.0.0.1:5000").
std::optional<int> AcceptedDescriptor(absl::string_view grpc_peer);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_PEER_CREDENTIALS_H_
