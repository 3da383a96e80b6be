#include "endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "channel_credentials.h"
#include "flagos/v1/flagos.grpc.pb.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace flagos::client {
namespace {

// Reconnect quickly while waiting for a daemon that is starting up.
constexpr int kReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;

constexpr absl::string_view kSystemSocketPath = "/run/flagosd/flagosd.sock";

// The socket exists and a daemon may well listen on it; this user may not
// connect. Starting another daemon there would not help: say who may.
absl::Status SocketPermissionError(absl::string_view endpoint, const std::string& path,
                                   const struct stat& st) {
  std::string group = absl::StrCat(st.st_gid);
  if (const struct group* entry = getgrgid(st.st_gid); entry != nullptr) group = entry->gr_name;
  std::string owner = absl::StrCat(st.st_uid);
  if (const struct passwd* entry = getpwuid(st.st_uid); entry != nullptr) owner = entry->pw_name;
  const std::string what =
      absl::StrCat("flagos: permission denied on ", path, " (the socket of flagosd at ", endpoint,
                   "; owner ", owner, ", group ", group, ", mode ",
                   absl::StrFormat("%04o", st.st_mode & 07777), "): ");
  if ((st.st_mode & 0060) == 0060) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, "members of group ", group, " may connect: ask the node's administrator to add you "
        "(`usermod -aG ", group, " $USER`, effective at your next login), or set "
        "FLAGOS_ENDPOINT to a daemon you may use"));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, "only its owner may connect: ask whoever runs that flagosd to open it to a group of "
      "yours (--socket-mode=0660), or set FLAGOS_ENDPOINT to a daemon you may use"));
}

// Checks that a daemon listens on the unix socket at `path`: OK, or
// UnreachableError / INVALID_ARGUMENT naming what is wrong.
absl::Status ProbeUnixSocket(absl::string_view endpoint, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return UnreachableError(endpoint, absl::StrCat("no such socket: ", path));
    }
    return UnreachableError(endpoint,
                            absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return UnreachableError(endpoint, absl::StrCat(path, " exists but is not a socket"));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flagos: the socket path of endpoint ", endpoint, " is longer than ",
                     sizeof(addr.sun_path) - 1, " bytes: use a shorter path"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();  // let gRPC try and report
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int connect_errno = errno;
  close(fd);
  if (rc == 0) return absl::OkStatus();
  switch (connect_errno) {
    case ECONNREFUSED:
      return UnreachableError(
          endpoint, absl::StrCat("connection refused: no daemon listens on ", path));
    case EACCES:
    case EPERM:
      return SocketPermissionError(endpoint, path, st);
    default:
      return absl::OkStatus();  // e.g. EAGAIN (backlog full): gRPC retries
  }
}

// For "host:port" with a numeric host or localhost: OK when something
// accepts TCP connections there (or the probe cannot tell); UNAVAILABLE at
// once when the connection is refused, instead of gRPC's retrying until the
// deadline. Names that need DNS are left to gRPC.
absl::Status ProbeTcpEndpoint(absl::string_view endpoint, absl::Duration timeout) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || endpoint.find("://") != absl::string_view::npos) {
    return absl::OkStatus();
  }
  std::string host(endpoint.substr(0, colon));
  const std::string port(endpoint.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (host == "localhost" ? 0 : AI_NUMERICHOST);
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return absl::OkStatus();
  bool refused_everywhere = true;
  for (addrinfo* a = found; a != nullptr && refused_everywhere; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      refused_everywhere = false;
      break;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
      if (poll(&p, 1, wait_ms) == 1) {
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    close(fd);
    if (err != ECONNREFUSED) refused_everywhere = false;
  }
  freeaddrinfo(found);
  if (refused_everywhere) {
    return UnreachableError(endpoint, "connection refused: no daemon listens there");
  }
  return absl::OkStatus();
}

// gRPC's reason for the channel's last failed connection attempt, from a
// call that fails at once.
std::string LastConnectionError(const std::shared_ptr<grpc::Channel>& channel) {
  std::unique_ptr<v1::Flagos::Stub> stub = v1::Flagos::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  v1::NegotiateRequest request;
  v1::NegotiateResponse response;
  const grpc::Status status = stub->Negotiate(&context, request, &response);
  return status.ok() ? std::string("it connected on retry") : status.error_message();
}

}  // namespace

std::optional<std::string> UnixSocketPath(absl::string_view endpoint) {
  if (absl::StartsWith(endpoint, "unix://")) return std::string(endpoint.substr(7));
  if (absl::StartsWith(endpoint, "unix:")) return std::string(endpoint.substr(5));
  if (absl::StartsWith(endpoint, "/")) return std::string(endpoint);
  return std::nullopt;
}

std::string TcpHost(absl::string_view endpoint) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&endpoint, scheme)) break;
  }
  absl::string_view host = endpoint.substr(0, endpoint.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

namespace {

// The command that starts a flagosd serving `endpoint` in a way this client
// can connect to (flagosd refuses plaintext TCP unless --insecure-tcp on
// loopback, and TCP anywhere else without TLS and a token).
std::string StartCommand(absl::string_view endpoint) {
  if (std::optional<std::string> path = UnixSocketPath(endpoint)) {
    if (*path == kSystemSocketPath) {
      return "`systemctl start flagosd` (the node's unit, docs/operations.md)";
    }
    return absl::StrCat("`flagosd --listen=unix://", *path, "`");
  }
  const size_t colon = endpoint.rfind(':');
  absl::string_view host = endpoint.substr(0, colon);
  const absl::string_view port = endpoint.substr(colon + 1);
  if (host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.")) {
    if (const char* ca = std::getenv("FLAGOS_TLS_CA"); ca == nullptr || *ca == '\0') {
      // This client speaks plaintext (no FLAGOS_TLS_CA), which flagosd
      // serves on loopback only when asked to.
      return absl::StrCat("`flagosd --listen=", endpoint, " --insecure-tcp`");
    }
    return absl::StrCat("`flagosd --listen=", endpoint,
                        " --tls-cert=CERT.pem --tls-key=KEY.pem --token-file=TOKEN` (the "
                        "certificate chaining to FLAGOS_TLS_CA)");
  }
  return absl::StrCat("`flagosd --listen=0.0.0.0:", port,
                      " --tls-cert=CERT.pem --tls-key=KEY.pem --token-file=TOKEN` on that node "
                      "(docs/operations.md, \"A client on another node\")");
}

}  // namespace

absl::Status UnreachableError(absl::string_view endpoint, absl::string_view reason) {
  return absl::UnavailableError(absl::StrCat("flagosd at ", endpoint, " is not reachable (",
                                             reason, "): start it with ", StartCommand(endpoint),
                                             ", or set FLAGOS_ENDPOINT to a running daemon"));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToEndpoint(const std::string& endpoint,
                                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (endpoint.empty()) {
    return absl::InvalidArgumentError(
        "flagos: empty flagosd endpoint: set FLAGOS_ENDPOINT to unix:///path/to/flagosd.sock or "
        "host:port");
  }
  std::string target = endpoint;  // as gRPC spells it
  if (std::optional<std::string> path = UnixSocketPath(endpoint)) {
    // A bare absolute path is a unix socket too (gRPC would look it up as a
    // host name).
    if (absl::StartsWith(endpoint, "/")) target = absl::StrCat("unix://", endpoint);
    absl::Status probe = ProbeUnixSocket(endpoint, *path);
    if (!probe.ok()) return probe;
  } else {
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flagos: endpoint ", endpoint, " is neither a unix socket (unix:///path/to/"
          "flagosd.sock, or the absolute path) nor host:port: set FLAGOS_ENDPOINT (or "
          "--endpoint) to one of those"));
    }
    absl::Status probe = ProbeTcpEndpoint(endpoint, timeout);
    if (!probe.ok()) return probe;
  }
  absl::StatusOr<TcpSecurity> security = CredentialsForEndpoint(endpoint);
  if (!security.ok()) return security.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, security->credentials, args);
  const bool tcp = !UnixSocketPath(endpoint).has_value();
  while (true) {
    const grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return channel;
    // A TLS or plaintext mismatch, or a certificate not trusted, fails every
    // attempt alike: say so at once instead of retrying until the deadline.
    if (tcp && state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      const std::string reason = LastConnectionError(channel);
      if (IsTransportSecurityFailure(reason)) {
        return absl::UnavailableError(absl::StrCat("flagos: cannot connect to flagosd at ",
                                                   endpoint, ": ",
                                                   ExplainTcpFailure(*security, reason)));
      }
    }
    const absl::Time until = std::min(deadline, absl::Now() + absl::Milliseconds(100));
    if (!channel->WaitForStateChange(state, absl::ToChronoTime(until)) &&
        absl::Now() >= deadline) {
      break;
    }
  }
  const std::string waited = absl::StrCat("no connection within ", absl::FormatDuration(timeout));
  if (!tcp) return UnreachableError(endpoint, waited);
  return UnreachableError(
      endpoint, ExplainTcpFailure(*security,
                                  absl::StrCat(waited, ": ", LastConnectionError(channel))));
}

}  // namespace flagos::client
