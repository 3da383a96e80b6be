#include "unary_calls.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "endpoint.h"
#include "flagos/client/connection.h"
#include "grpcpp/client_context.h"
#include "status_codes.h"

namespace flagos::client {
namespace {

// A unary call that did not get through: the daemon is gone, hung or
// overloaded; anything else is the daemon's own answer.
absl::Status UnaryCallError(const grpc::Status& status, const std::string& endpoint,
                            absl::string_view rpc) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return UnreachableError(endpoint,
                              absl::StrCat(rpc, " failed: ", DescribeGrpcStatus(status)));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::UnavailableError(
          absl::StrCat("flagosd at ", endpoint, " did not answer ", rpc,
                       " in time: it may be overloaded or hung; check its log or restart it"));
    default:
      return FromGrpcStatus(
          status, absl::StrCat("flagos: ", rpc, " with flagosd at ", endpoint, " failed"));
  }
}

}  // namespace

absl::StatusOr<v1::NegotiateResponse> Negotiate(v1::Flagos::Stub& stub, const std::string& endpoint,
                                                const std::string& client_name,
                                                absl::Time deadline) {
  v1::NegotiateRequest request;
  request.set_min_version(kProtocolMinVersion);
  request.set_max_version(kProtocolMaxVersion);
  request.set_client(client_name);
  v1::NegotiateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::Status status = stub.Negotiate(&context, request, &response);
  if (!status.ok()) return UnaryCallError(status, endpoint, "Negotiate");
  if (response.version() < kProtocolMinVersion || response.version() > kProtocolMaxVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("flagosd at ", endpoint, " (daemon ", response.daemon_version(),
                     ") chose protocol version ", response.version(),
                     ", but this client speaks versions ", kProtocolMinVersion, " to ",
                     kProtocolMaxVersion, ": install torch_fl and flagosd from the same release"));
  }
  return response;
}

absl::StatusOr<v1::GetStatsResponse> FetchStats(v1::Flagos::Stub& stub, const std::string& endpoint,
                                                absl::Time deadline) {
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::Status status = stub.GetStats(&context, v1::GetStatsRequest(), &response);
  if (!status.ok()) return UnaryCallError(status, endpoint, "GetStats");
  return response;
}

}  // namespace flagos::client
