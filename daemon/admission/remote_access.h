// Clients on other nodes: TCP listening needs TLS (--tls-cert, --tls-key,
// optionally --tls-client-ca for mutual TLS) and a bearer token
// (--token-file) that every call must carry ("authorization: Bearer ..."),
// checked in constant time and never logged. Plaintext TCP is allowed only
// on loopback, when asked for with --insecure-tcp (a test, or an SSH tunnel's
// end), and takes no token. Unix sockets need neither: the kernel names
// their peers (peer_credentials.h).
#ifndef FLAGOS_DAEMON_ADMISSION_REMOTE_ACCESS_H_
#define FLAGOS_DAEMON_ADMISSION_REMOTE_ACCESS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/listen_endpoint.h"

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace flagos::daemon {

struct RemoteAccessOptions {
  std::string tls_cert_file;       // PEM certificate chain
  std::string tls_key_file;        // PEM private key
  std::string tls_client_ca_file;  // PEM CAs client certificates must chain to; empty: none asked
  std::string token_file;          // the bearer token, alone in the file
  bool insecure_tcp = false;       // plaintext TCP on loopback

  bool tls() const { return !tls_cert_file.empty() || !tls_key_file.empty(); }
};

// The longest token --token-file may hold, and the shortest.
inline constexpr size_t kMaxTokenBytes = 4096;
inline constexpr size_t kMinTokenBytes = 16;

// OK when `endpoint` may be listened on with `options`: unix sockets always;
// TCP with TLS and a token, or plaintext on loopback with --insecure-tcp.
// INVALID_ARGUMENT saying which flags are missing otherwise.
absl::Status CheckTcpEndpoint(const ListenEndpoint& endpoint, const RemoteAccessOptions& options);

// The credentials TCP endpoints listen with: TLS with the certificate, key
// and client CA read from their files, every call's token checked; or
// plaintext (insecure_tcp). FAILED_PRECONDITION naming an unreadable file
// or a bad token file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const RemoteAccessOptions& options);

// True when `header` is "Bearer <token>": compared in time that depends on
// the lengths only.
bool BearerTokenMatches(absl::string_view header, absl::string_view token);

// The token of a --token-file: its contents without surrounding whitespace.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_ADMISSION_REMOTE_ACCESS_H_
