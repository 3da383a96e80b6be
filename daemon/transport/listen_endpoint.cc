#include "transport/listen_endpoint.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

// "127.x.x.x" only as an IPv4 address: a host name starting "127." is
// whatever DNS says it is.
bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost" || host == "[::1]") return true;
  in_addr address{};
  return inet_pton(AF_INET, std::string(host).c_str(), &address) == 1 &&
         (ntohl(address.s_addr) >> 24) == 127;
}

// The path of the system socket, however --listen spells it.
constexpr absl::string_view kSystemSocketPath = "/run/flagosd/flagosd.sock";
static_assert(absl::string_view(kDefaultListen).substr(7) == kSystemSocketPath);

// OK when something accepts connections on `path`.
bool SomeoneListens(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const bool connected =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

}  // namespace

absl::StatusOr<ListenEndpoint> ParseListenEndpoint(absl::string_view spec) {
  ListenEndpoint endpoint;
  endpoint.uri = std::string(spec);
  if (absl::StartsWith(spec, "unix:")) {
    absl::string_view path = spec.substr(5);
    if (absl::StartsWith(path, "//")) path.remove_prefix(2);  // unix:///abs -> /abs
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen ", spec, ": the unix socket path is empty"));
    }
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", spec, ": the unix socket path is ", path.size(),
          " bytes long; the system limit is ", sizeof(sockaddr_un{}.sun_path) - 1,
          "; choose a shorter path"));
    }
    endpoint.unix_path = std::string(path);
    endpoint.system_socket = path == kSystemSocketPath;
    endpoint.mode = endpoint.system_socket ? 0660 : 0600;
    return endpoint;
  }
  const size_t colon = spec.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(spec.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    if (absl::StartsWith(spec, "/")) {  // what a client may write, but a listener must not guess
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", spec, ": a unix socket is written with its scheme: --listen=unix://",
          spec));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", spec, ": expected unix:///path/to/socket or host:port"));
  }
  endpoint.loopback = IsLoopbackHost(spec.substr(0, colon));
  return endpoint;
}

absl::Status PrepareUnixSocket(const ListenEndpoint& endpoint) {
  if (endpoint.unix_path.empty()) return absl::OkStatus();
  const std::filesystem::path path(endpoint.unix_path);
  std::error_code error;
  if (path.has_parent_path() && !std::filesystem::exists(path.parent_path(), error)) {
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create ", path.parent_path().string(), " for the socket ", endpoint.uri, ": ",
          error.message(), "; create it or choose another --listen"));
    }
    chmod(path.parent_path().c_str(), 0755);
  }
  struct stat info;
  if (lstat(endpoint.unix_path.c_str(), &info) != 0) return absl::OkStatus();  // nothing there
  if (!S_ISSOCK(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        endpoint.unix_path, " exists and is not a socket; remove it or choose another --listen"));
  }
  if (SomeoneListens(endpoint.unix_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another process (a running flagosd?) already listens on ", endpoint.uri,
                     "; stop it or choose another --listen"));
  }
  if (unlink(endpoint.unix_path.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot remove the stale socket ",
                                                      endpoint.unix_path, ": ",
                                                      std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ResolveSocketGroup(ListenEndpoint& endpoint, absl::string_view group) {
  endpoint.group.clear();
  endpoint.gid = static_cast<gid_t>(-1);
  if (endpoint.unix_path.empty() || group.empty()) return absl::OkStatus();
  const std::string name(group);
  // getgrnam_r: the daemon's other threads may look up groups too
  // (--allow-gid); getgrnam's static buffer is not theirs to share.
  std::string buffer(16384, '\0');
  struct group entry;
  struct group* found = nullptr;
  int error = 0;
  while ((error = getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found)) ==
             ERANGE &&
         buffer.size() < (1u << 24)) {
    buffer.resize(buffer.size() * 2);
  }
  if (found == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the socket ", endpoint.uri, " is to belong to group `", name,
        "` (--socket-group), but ",
        error != 0 ? absl::StrCat("looking that group up failed (", std::strerror(error), ")")
                   : std::string("no such group exists"),
        ": create it with `addgroup --system ", name, "` (or `groupadd --system ", name,
        "`) and add the users who may connect to it, or name another group with "
        "--socket-group=NAME"));
  }
  endpoint.group = name;
  endpoint.gid = found->gr_gid;
  return absl::OkStatus();
}

absl::Status SecureUnixSocket(const ListenEndpoint& endpoint) {
  if (endpoint.unix_path.empty()) return absl::OkStatus();
  if (!endpoint.group.empty()) {
    if (chown(endpoint.unix_path.c_str(), static_cast<uid_t>(-1), endpoint.gid) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot give ", endpoint.unix_path, " to group `", endpoint.group, "`: ",
          std::strerror(errno),
          errno == EPERM ? "; flagosd must run as root or as a member of that group" : ""));
    }
  }
  if (chmod(endpoint.unix_path.c_str(), endpoint.mode) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot set the mode of ",
                                                      endpoint.unix_path, ": ",
                                                      std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace flagos::daemon
