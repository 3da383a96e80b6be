// Connection::Open and the session-less entry points.
#include "flagos/client/connection.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "endpoint.h"
#include "session_connection.h"
#include "unary_calls.h"

namespace flagos::client {

bool ConnectionOptions::StagingWantedByEnvironment() {
  const char* value = std::getenv("FLAGOS_STAGING");
  return value == nullptr || std::string(value) != "0";
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& endpoint,
                                                             absl::Duration timeout,
                                                             const std::string& client_name,
                                                             const ConnectionOptions& options) {
  // One deadline bounds every step: connecting, Negotiate and the handshake.
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ConnectToEndpoint(endpoint, timeout);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<v1::Flagos::Stub> stub = v1::Flagos::NewStub(*channel);
  absl::StatusOr<v1::NegotiateResponse> info = Negotiate(*stub, endpoint, client_name, deadline);
  if (!info.ok()) return info.status();
  auto connection =
      std::make_unique<SessionConnection>(endpoint, std::move(stub), *std::move(info), options);
  absl::Status opened = connection->OpenSession(client_name, deadline);
  if (!opened.ok()) return opened;
  return std::unique_ptr<Connection>(std::move(connection));
}

absl::StatusOr<v1::GetStatsResponse> QueryStats(const std::string& endpoint,
                                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ConnectToEndpoint(endpoint, timeout);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<v1::Flagos::Stub> stub = v1::Flagos::NewStub(*channel);
  return FetchStats(*stub, endpoint, deadline);
}

}  // namespace flagos::client
