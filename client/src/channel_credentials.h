// How a client authenticates to a flagosd over TCP, from its environment:
//   FLAGOS_TLS_CA            PEM CA certificates the daemon's certificate must
//                            chain to; set: TLS, unset: plaintext (a daemon
//                            started with --insecure-tcp, on loopback)
//   FLAGOS_TLS_CERT, FLAGOS_TLS_KEY   the client's certificate and key, for a
//                            daemon that asks for them (--tls-client-ca)
//   FLAGOS_TOKEN, FLAGOS_TOKEN_FILE   the bearer token every call carries
//                            (TLS only: a token never travels in plaintext)
// Unix-socket endpoints use none of them: the kernel tells the daemon who
// connected.
#ifndef FLAGOS_CLIENT_SRC_CHANNEL_CREDENTIALS_H_
#define FLAGOS_CLIENT_SRC_CHANNEL_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"

namespace flagos::client {

struct TcpSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  bool tls = false;
  std::string ca_file;  // FLAGOS_TLS_CA, for error messages
};

// The credentials for `endpoint`. INVALID_ARGUMENT / FAILED_PRECONDITION
// naming the variable when a file cannot be read, a certificate comes
// without its key, or a token is set without TLS.
absl::StatusOr<TcpSecurity> CredentialsForEndpoint(absl::string_view endpoint);

// True when gRPC's connection error `reason` is a TLS failure that
// retrying cannot fix (a handshake, a certificate, a plaintext peer).
bool IsTransportSecurityFailure(absl::string_view reason);

// Why a TCP connection to `endpoint` failed, from gRPC's last error
// (`reason`), in the words a user can act on: a certificate not trusted, a
// TLS daemon reached in plaintext, a client certificate missing ...
std::string ExplainTcpFailure(const TcpSecurity& security, absl::string_view reason);

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_CHANNEL_CREDENTIALS_H_
