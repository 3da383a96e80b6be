// Reaching a flagosd endpoint: "unix:///abs/path" (or "unix:path", or the
// bare absolute path "/abs/path") for a daemon on this node, "host:port" for one on another node.
//
// A unix socket is checked before gRPC is involved, so that a missing socket
// or a stale one with no daemon behind it fails at once with a precise
// reason instead of after the whole timeout.
#ifndef FLAGOS_CLIENT_SRC_ENDPOINT_H_
#define FLAGOS_CLIENT_SRC_ENDPOINT_H_

#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace flagos::client {

// The largest gRPC message either side accepts (the protocol's limit).
inline constexpr int kMaxMessageBytes = 256 << 20;

// The socket path of a "unix:" endpoint; nullopt for any other endpoint.
std::optional<std::string> UnixSocketPath(absl::string_view endpoint);

// The host of a TCP endpoint "host:port" (also "dns:///host:port",
// "ipv4:a.b.c.d:port", "ipv6:[::1]:port"), without an IPv6 address's
// brackets, for getaddrinfo.
std::string TcpHost(absl::string_view endpoint);

// UNAVAILABLE: "flagosd at <endpoint> is not reachable (<reason>): start it
// with <a command that serves this endpoint to this client>, or set
// FLAGOS_ENDPOINT to a running daemon". (A socket this user may not open is
// PERMISSION_DENIED instead, naming the socket's group.)
absl::Status UnreachableError(absl::string_view endpoint, absl::string_view reason);

// A channel to `endpoint` in state READY, or UnreachableError when it does
// not connect within `timeout`. Channels are not shared between calls (each
// connection gets its own transport).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToEndpoint(const std::string& endpoint,
                                                                 absl::Duration timeout);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_ENDPOINT_H_
