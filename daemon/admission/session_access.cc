#include "admission/session_access.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flagos::daemon {
namespace {

bool Listed(const std::vector<int64_t>& ids, int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Each value: a number, or a name `lookup` resolves (nullopt: no such).
absl::StatusOr<std::vector<int64_t>> ParseIds(
    const std::vector<std::string>& values, const char* flag, const char* what,
    const std::function<std::optional<int64_t>(const std::string&)>& lookup) {
  std::vector<int64_t> ids;
  for (const std::string& value : values) {
    if (value.empty()) continue;
    int64_t id = -1;
    if (absl::SimpleAtoi(value, &id) && id >= 0 && id <= 0xfffffffe) {
      ids.push_back(id);
      continue;
    }
    std::optional<int64_t> found = lookup(value);
    if (!found.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": no ", what, " named '", value, "' on this node; give a name `getent ", what,
          "` knows, or a number"));
    }
    ids.push_back(*found);
  }
  return ids;
}

}  // namespace

absl::Status SessionAccess::Check(const std::optional<PeerCredentials>& peer) const {
  if (!restricted()) return absl::OkStatus();
  if (!peer.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this flagosd admits sessions by user (", Describe(),
        "), and a TCP connection carries no user; connect through the daemon's unix socket"));
  }
  if (peer->uid == 0 || peer->uid == static_cast<int64_t>(geteuid()) || Listed(uids, peer->uid) ||
      Listed(gids, peer->gid)) {
    return absl::OkStatus();
  }
  for (gid_t group : peer->groups) {
    if (Listed(gids, group)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", peer->uid, " (gid ", peer->gid, ", pid ", peer->pid,
      ") may not open a session: this flagosd admits only ", Describe(),
      "; ask the node's administrator to add the user or one of its groups"));
}

std::string SessionAccess::Describe() const {
  std::vector<std::string> rules;
  if (!uids.empty()) rules.push_back(absl::StrCat("--allow-uid=", absl::StrJoin(uids, ",")));
  if (!gids.empty()) rules.push_back(absl::StrCat("--allow-gid=", absl::StrJoin(gids, ",")));
  return absl::StrJoin(rules, " ");
}

absl::StatusOr<std::vector<int64_t>> ParseAllowedUsers(const std::vector<std::string>& values) {
  return ParseIds(values, "--allow-uid", "passwd", [](const std::string& name) {
    std::optional<int64_t> id;
    passwd entry{};
    passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr) {
      id = found->pw_uid;
    }
    return id;
  });
}

absl::StatusOr<std::vector<int64_t>> ParseAllowedGroups(const std::vector<std::string>& values) {
  return ParseIds(values, "--allow-gid", "group", [](const std::string& name) {
    std::optional<int64_t> id;
    group entry{};
    group* found = nullptr;
    std::vector<char> buffer(16384);
    if (getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr) {
      id = found->gr_gid;
    }
    return id;
  });
}

}  // namespace flagos::daemon
