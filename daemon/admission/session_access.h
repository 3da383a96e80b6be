// Who may open a session: --allow-uid and --allow-gid, checked against the
// peer credentials the kernel gave for the session's connection.
//
// With neither flag every peer that can open the socket may (the socket
// file's mode and group are the rule). With either, a session is admitted
// when the peer's uid is listed, or its primary or one of its supplementary
// groups is; root and the daemon's own user always are (they can read the
// daemon's memory anyway). A peer without credentials (TCP) is then refused.
#ifndef FLAGOS_DAEMON_ADMISSION_SESSION_ACCESS_H_
#define FLAGOS_DAEMON_ADMISSION_SESSION_ACCESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission/peer_credentials.h"

namespace flagos::daemon {

struct SessionAccess {
  std::vector<int64_t> uids;  // --allow-uid
  std::vector<int64_t> gids;  // --allow-gid

  bool restricted() const { return !uids.empty() || !gids.empty(); }

  // OK when `peer` may open a session; PERMISSION_DENIED naming the peer
  // and the rule otherwise. `peer` is nullopt for a connection without
  // credentials (TCP).
  absl::Status Check(const std::optional<PeerCredentials>& peer) const;

  // "--allow-uid=1000,1001 --allow-gid=27", or "" when unrestricted.
  std::string Describe() const;
};

// --allow-uid's value: user names or numeric uids. INVALID_ARGUMENT naming
// an unknown user.
absl::StatusOr<std::vector<int64_t>> ParseAllowedUsers(const std::vector<std::string>& values);
// --allow-gid's value: group names or numeric gids.
absl::StatusOr<std::vector<int64_t>> ParseAllowedGroups(const std::vector<std::string>& values);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_SESSION_ACCESS_H_
