#include "admission/remote_access.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

constexpr char kBearer[] = "Bearer ";

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  // A directory opens, and reads as an empty file.
  if (std::error_code error; std::filesystem::is_directory(path, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", path, ": is a directory; give the file itself"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, "=", path, ": cannot read the file; check the path and that flagosd's user may "
        "read it"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Admits a call whose "authorization" metadata is "Bearer <token>", and
// takes the header out of what the handlers see.
class TokenCheck : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenCheck(std::string token) : token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) override {
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "flagosd requires a bearer token on TCP and the call carried none: set "
                          "FLAGOS_TOKEN or FLAGOS_TOKEN_FILE to the token of the node's "
                          "flagosd (its --token-file)");
    }
    const absl::string_view header(it->second.data(), it->second.size());
    if (!BearerTokenMatches(header, token_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "flagosd refused the bearer token: FLAGOS_TOKEN / FLAGOS_TOKEN_FILE "
                          "does not hold the token of the node's flagosd (its --token-file)");
    }
    consumed->insert(std::make_pair(std::string(it->first.data(), it->first.size()),
                                    std::string(header)));
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

}  // namespace

absl::Status CheckTcpEndpoint(const ListenEndpoint& endpoint, const RemoteAccessOptions& options) {
  if (!endpoint.unix_path.empty()) return absl::OkStatus();
  if (options.tls()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen=", endpoint.uri, ": TLS needs both --tls-cert and --tls-key"));
    }
    if (options.token_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen=", endpoint.uri, ": a TCP endpoint needs a bearer token as well as TLS: "
          "give --token-file (a file holding a random token of at least ", kMinTokenBytes,
          " characters, e.g. `openssl rand -hex 32`)"));
    }
    return absl::OkStatus();
  }
  if (!endpoint.loopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", endpoint.uri, ": TCP on a non-loopback address needs TLS and a token: give "
        "--tls-cert, --tls-key and --token-file (docs/operations.md, \"A client on another "
        "node\"), or listen on a unix socket"));
  }
  if (!options.insecure_tcp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", endpoint.uri, ": plaintext TCP is refused unless asked for with "
        "--insecure-tcp (loopback only: anyone on this node may connect, with no user known); "
        "or give --tls-cert, --tls-key and --token-file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const RemoteAccessOptions& options) {
  if (!options.tls()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(options.tls_key_file, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(options.tls_client_ca_file, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  absl::StatusOr<std::string> token = ReadTokenFile(options.token_file);
  if (!token.ok()) return token.status();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
  credentials->SetAuthMetadataProcessor(std::make_shared<TokenCheck>(*std::move(token)));
  return credentials;
}

bool BearerTokenMatches(absl::string_view header, absl::string_view token) {
  if (!absl::StartsWith(header, kBearer)) return false;
  header.remove_prefix(sizeof(kBearer) - 1);
  if (header.size() != token.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < token.size(); ++i) {
    difference |= static_cast<unsigned char>(header[i] ^ token[i]);
  }
  return difference == 0;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path, "--token-file");
  if (!contents.ok()) return contents.status();
  const std::string token(absl::StripAsciiWhitespace(*contents));
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--token-file=", path, ": the token must be ", kMinTokenBytes, " to ", kMaxTokenBytes,
        " characters (it has ", token.size(), "); write one with `openssl rand -hex 32 > ", path,
        "`"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--token-file=", path, ": the token must be printable ASCII without spaces (it travels "
          "in an HTTP/2 header)"));
    }
  }
  return token;
}

}  // namespace flagos::daemon
