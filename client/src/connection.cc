// Connection::Open and the session-less entry points.
#include "flagos/client/connection.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

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
      std::make_unique<SessionConnection>(endpoint, *channel, *std::move(info), options);
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

absl::Status QueryHealth(const std::string& endpoint, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ConnectToEndpoint(endpoint, timeout);
  if (!channel.ok()) return channel.status();
  // grpc.health.v1 without its generated code: HealthCheckRequest{service:
  // ""} is the empty message; HealthCheckResponse is field 1, an enum
  // (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN), as a varint.
  grpc::GenericStub stub(*channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::Slice nothing{std::string()};
  grpc::ByteBuffer request(&nothing, 1);  // an empty, but valid, buffer
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("flagosd at ", endpoint,
                                               " did not answer its health check: ",
                                               CodeName(status.error_code()), ": ",
                                               status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  int serving = 0;  // UNKNOWN when the field is absent
  if (bytes.size() >= 2 && bytes[0] == 0x08) serving = static_cast<unsigned char>(bytes[1]);
  if (serving == 1) return absl::OkStatus();
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return absl::UnavailableError(absl::StrCat(
      "flagosd at ", endpoint, " reports health ", serving < 4 ? kNames[serving] : "?",
      "; check its log (journalctl -u flagosd)"));
}

}  // namespace flagos::client
