#include "channel_credentials.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "endpoint.h"

namespace flagos::client {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* variable) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("flagos: ", variable, "=", path, " cannot be read; check the path"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

absl::StatusOr<std::string> Token() {
  std::string token = Env("FLAGOS_TOKEN");
  const std::string file = Env("FLAGOS_TOKEN_FILE");
  if (token.empty() && !file.empty()) {
    absl::StatusOr<std::string> contents = ReadFile(file, "FLAGOS_TOKEN_FILE");
    if (!contents.ok()) return contents.status();
    token = *std::move(contents);
  }
  return std::string(absl::StripAsciiWhitespace(token));
}

}  // namespace

absl::StatusOr<TcpSecurity> CredentialsForEndpoint(absl::string_view endpoint) {
  TcpSecurity security;
  if (UnixSocketPath(endpoint).has_value()) {
    security.credentials = grpc::InsecureChannelCredentials();
    return security;
  }
  absl::StatusOr<std::string> token = Token();
  if (!token.ok()) return token.status();
  security.ca_file = Env("FLAGOS_TLS_CA");
  const std::string cert_file = Env("FLAGOS_TLS_CERT");
  const std::string key_file = Env("FLAGOS_TLS_KEY");
  if (security.ca_file.empty()) {
    if (!cert_file.empty() || !key_file.empty() || !token->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flagos: FLAGOS_TLS_CA is not set, so the connection to ", endpoint,
          " would be plaintext, and a token or client certificate (FLAGOS_TOKEN, "
          "FLAGOS_TOKEN_FILE, FLAGOS_TLS_CERT) is never sent in plaintext: set FLAGOS_TLS_CA to "
          "the CA certificate of the daemon's TLS certificate"));
    }
    security.credentials = grpc::InsecureChannelCredentials();
    return security;
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadFile(security.ca_file, "FLAGOS_TLS_CA");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "flagos: FLAGOS_TLS_CERT and FLAGOS_TLS_KEY go together (the client certificate and its "
        "key); set both or neither");
  }
  if (!cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(cert_file, "FLAGOS_TLS_CERT");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(key_file, "FLAGOS_TLS_KEY");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  security.tls = true;
  security.credentials = grpc::SslCredentials(ssl);
  if (!token->empty()) {
    security.credentials = grpc::CompositeChannelCredentials(
        security.credentials, grpc::AccessTokenCredentials(*token));
  }
  return security;
}

bool IsTransportSecurityFailure(absl::string_view reason) {
  for (absl::string_view sign : {"Ssl handshake failed", "SSL_ERROR", "CERTIFICATE_VERIFY",
                                 "certificate verify failed", "Handshake", "handshake", "Socket closed",
                                 "Connection reset"}) {
    if (absl::StrContains(reason, sign)) return true;
  }
  return false;
}

std::string ExplainTcpFailure(const TcpSecurity& security, absl::string_view reason) {
  if (!security.tls) {
    return absl::StrCat("no plaintext connection (", reason,
                        "); if the daemon serves TLS, set FLAGOS_TLS_CA to its CA certificate "
                        "and FLAGOS_TOKEN or FLAGOS_TOKEN_FILE to its token");
  }
  if (absl::StrContains(reason, "CERTIFICATE_VERIFY_FAILED") ||
      absl::StrContains(reason, "certificate verify failed")) {
    return absl::StrCat("the daemon's TLS certificate is not trusted: it does not chain to the CA "
                        "in FLAGOS_TLS_CA=", security.ca_file, " (", reason, ")");
  }
  if (absl::StrContains(reason, "WRONG_VERSION_NUMBER") ||
      absl::StrContains(reason, "wrong version number")) {
    return absl::StrCat("the TLS handshake failed: the daemon does not serve TLS there (",
                        reason, "); unset FLAGOS_TLS_CA for a daemon started with --insecure-tcp");
  }
  return absl::StrCat("the TLS handshake failed (", reason,
                      "); if the daemon asks for client certificates (--tls-client-ca), set "
                      "FLAGOS_TLS_CERT and FLAGOS_TLS_KEY");
}

}  // namespace flagos::client
